"""What a command prints besides its results: a warning is one line of rul's own, and an
emulated precision is named before training starts."""

import warnings

import pytest
import torch
from click.testing import CliRunner

from rul.cli import main
from rul.console import show_warning
from rul.training import hardware
from rul.training.precision import Precision

CPU = torch.device("cpu")


@pytest.fixture
def restore_showwarning():
    saved = warnings.showwarning
    yield
    warnings.showwarning = saved


def test_a_training_prints_its_warnings_as_one_line_and_names_an_emulated_precision(
        write_cmapss, tmp_path, monkeypatch, restore_showwarning):
    """A test unit shorter than the window is padded (a PaddedUnitWarning): one line, not
    Python's `file:line: Category` and the source line; bf16 on a CPU without native bf16 is
    named with its slow-down before the first epoch."""
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    folder = write_cmapss()  # test unit 3 has 22 cycles, the window 30
    result = CliRunner().invoke(main, [
        "train", "epochs=1", "filters=4", "num_layers=2", "hidden_size=8", "precision=bf16",
        "device=cpu", "register=false", "interval_coverage=null", f"data_dir={folder}",
        f"tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"checkpoint_dir={tmp_path}/ckpt",
        "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    padded = [line for line in lines if "padded 1 test unit(s)" in line]
    assert padded and all(line.startswith("warning: padded") for line in padded)
    assert len(padded) == 1  # once, however often it is raised
    assert not any("Warning:" in line or "warnings.warn" in line for line in lines)
    emulated = [line for line in lines if "emulated" in line]
    assert emulated == ["precision=bf16 is emulated on this CPU: about 7x slower than fp32 (no "
                        "AVX512-BF16 or AMX here); precision=auto picks the fastest that keeps "
                        "the accuracy here"]


@pytest.mark.parametrize("device, name, native, expected", [
    ("cpu", "bf16", False, "about 7x slower"), ("cpu", "bf16", True, None),
    ("cpu", "fp16", True, "about 5x slower"), ("cpu", "fp32", False, None),
    ("cuda", "fp16", False, None)])
def test_only_an_emulated_precision_has_a_note(monkeypatch, device, name, native, expected):
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    note = Precision(torch.device(device), name, use_scaler=name == "fp16").emulated
    assert note is None if expected is None else expected in note


def test_a_warning_shows_its_first_line_once(capsys):
    for _ in range(2):
        show_warning(UserWarning("first line\nsecond line"), UserWarning, "x.py", 3)
    show_warning(UserWarning(""), DeprecationWarning, "x.py", 3)
    assert capsys.readouterr().err == "warning: first line\nwarning: DeprecationWarning\n"


# Every line `rul train` and `rul tune` may print (stdout and stderr) on a first run: rul's
# own. A line of MLflow's, Optuna's or Python's warning machinery fails the test below.
ALLOWED = [r"a new MLflow store: sqlite:///(mlflow|\S+/a)\.db",
           r"warning: padded \d+ test unit\(s\) shorter than the window .*",
           r"test RMSE [\d.]+ \(uncapped [\d.]+\)  MAE [\d.]+  score [\d.]+  best epoch \d+ "
           r"\(val RMSE [\d.]+\)",
           r"track sensors(; test interval coverage \d+%, mean width [\d.]+ cycles)?",
           r"registered rul-fd001 version \d+; champion: version \d+( \(this run\))?",
           r"run [0-9a-f]{32} in experiment 'rul-fd001'",
           r"browse: .*mlflow ui --backend-store-uri .* --port \d+, then http://.*",
           r"study tiny-study: (new|continuing \(\d+ trials so far\))",
           r"study tiny-study: \d+ trials complete \d+.*",
           r"best trial \d+: val_rmse [\d.]+ with \{.*\}",
           r"registered rul-fd001 v\d+ \(champion moved: (true|false)\)"]


@pytest.mark.slow
def test_train_and_tune_print_only_rul_s_own_lines(write_cmapss, tmp_path):
    import re
    import subprocess
    import sys

    folder = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55, 49, 58, 44, 50))
    tiny = ["epochs=1", "filters=4", "num_layers=2", "hidden_size=8", "window=20",
            "micro_batch_size=64", "accumulation_steps=1", f"data_dir={folder}"]
    (tmp_path / "tune.yaml").write_text(
        "study_name: tiny-study\nn_trials: 2\nsearch_space:\n"
        "  lr: {type: float, low: 0.001, high: 0.003}\n")
    printed = []
    commands = [["train", *tiny, "--no-progress", f"tracking_uri=sqlite:///{tmp_path}/a.db"],
                ["tune", str(tmp_path / "tune.yaml"), *tiny]]  # side by side: two stores
    processes = [subprocess.Popen([sys.executable, "-m", "rul", *args], cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for args in commands]
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-1500:]
        printed += (out + err).splitlines()
    foreign = [line for line in printed if line.strip()
               and not any(re.fullmatch(pattern, line) for pattern in ALLOWED)]
    assert foreign == []
    assert any(line.startswith("registered rul-fd001 version 1") for line in printed)

"""What a command prints besides its results: a warning is one line of rul's own, and an
emulated precision is named before training starts."""

import warnings

import pytest
import torch
from click.testing import CliRunner

from rul.cli import main
from rul.console import one_line_warnings, show_warning
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


def test_each_command_says_its_warnings_though_one_process_ran_another(capsys,
                                                                      restore_showwarning):
    for _ in range(2):  # two commands in one process, each in its own filters (as two tests)
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            one_line_warnings()
            for _ in range(2):
                warnings.warn("2 test engines: the test figures say little", UserWarning,
                              stacklevel=1)
    assert capsys.readouterr().err == "warning: 2 test engines: the test figures say little\n" * 2


def test_the_last_lines_say_what_the_model_reads_and_its_interval_in_words():
    from types import SimpleNamespace

    from rul.cli import _track_line

    outcome = SimpleNamespace(metrics={"test_interval_coverage": 0.85,
                                       "test_interval_width": 31.24},
                              data=SimpleNamespace(test_units=list(range(100))))
    config = SimpleNamespace(include_cycle=True, interval_coverage=0.9)
    assert _track_line(config, outcome).splitlines() == [
        "reads the sensors and the engine's age: not comparable with published figures (they "
        "read the sensors only)",
        "test interval: the true RUL inside it for 85% of 100 engines (target 90%), mean width "
        "31.2 cycles"]
    outcome.metrics = {}
    assert _track_line(SimpleNamespace(include_cycle=False), outcome) == (
        "reads the sensors only: comparable with published figures")


# What `rul tune` says while it works (rul.tuning.progress): a trial's start, its epochs (the
# study's estimate with the first trial's) and end, then the study's time estimate.
TUNE_PROGRESS = [r"trial (\d+) \((\d+) of 2\): lr=0\.00\d+",
                 r"trial (\d+), epoch 1 of 1: val RMSE [\d.]+ \(best [\d.]+\); about [\d.]+ "
                 r"(?:s|min) for the trial \([\d.]+ (?:s|min) left\)(?:, the study about [\d.]+ "
                 r"(?:s|min))?",
                 r"trial (\d+): complete, 1 epoch, best val RMSE [\d.]+, \d+ s",
                 r"study tiny-study: (\d+) of 2 trials ended, [\d.]+ (?:s|min) each: about "
                 r"[\d.]+ (?:s|min) in all, [\d.]+ (?:s|min) left"]


# Every line `rul train` and `rul tune` may print (stdout and stderr) on a first run: rul's
# own. A line of MLflow's, Optuna's or Python's warning machinery fails the test below.
ALLOWED = [r"a new MLflow store: sqlite:///(mlflow|\S+/a)\.db",
           r"precision (fp32|bf16): .*",  # the precision a training takes, and why
           r"warning: padded \d+ test unit\(s\) shorter than the window .*",
           r"warning: \d+ (test|validation) engines?: the .* say little \(fewer than \d+\)",
           r"test RMSE [\d.]+( from \d+ engines)? \(uncapped [\d.]+\)  MAE [\d.]+  score "
           r"[\d.]+  best epoch \d+ \(val RMSE [\d.]+( from \d+ engines)?\)",
           r"reads the sensors only: comparable with published figures",
           r"test interval: the true RUL inside it for \d+% of \d+ engines? \(target \d+%\), "
           r"mean width [\d.]+ cycles",
           r"registered rul-fd001 version \d+; (no champion|champion: version \d+"
           r"( \(this version\))?): "
           r"(the best of the versions scored on the same engines, score and data|version \d+ "
           r"scores better on the same engines|not offered the alias .*)",
           r"run [0-9a-f]{32} in experiment 'rul-fd001'",
           r"browse: .*mlflow ui --backend-store-uri .* --port \d+, then http://.*",
           r"study tiny-study: (new|continuing \(\d+ trials so far\))",
           *TUNE_PROGRESS,
           r"study tiny-study: \d+ trials complete \d+.*",
           r"best trial \d+: val_rmse [\d.]+ with \{.*\}"]


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
    printed, said = [], {}
    commands = [["train", *tiny, "--no-progress", f"tracking_uri=sqlite:///{tmp_path}/a.db"],
                ["tune", str(tmp_path / "tune.yaml"), *tiny]]  # side by side: two stores
    processes = [subprocess.Popen([sys.executable, "-m", "rul", *args], cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for args in commands]
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-1500:]
        printed += (out + err).splitlines()
        said[process.args[3]] = err.splitlines()
    foreign = [line for line in printed if line.strip()
               and not any(re.fullmatch(pattern, line) for pattern in ALLOWED)]
    assert foreign == []
    assert any(line.startswith("registered rul-fd001 version 1") for line in printed)
    # the tune's progress, trial by trial, in order: start (its place), end, the estimate
    progress = [line for line in said["tune"]
                if any(re.fullmatch(pattern, line) for pattern in TUNE_PROGRESS)]
    numbers = [re.fullmatch(pattern, line).groups() for line, pattern
               in zip(progress, TUNE_PROGRESS * 2, strict=True)]  # fails if out of order
    assert numbers == [("0", "1"), ("0",), ("0",), ("1",), ("1", "2"), ("1",), ("1",), ("2",)], \
        progress
    first, second = (line for line in progress if ", epoch " in line)
    assert "the study about" in first and "the study" not in second  # once a trial has ended


def test_the_training_bar_estimates_the_run_from_the_epochs_it_has_seen():
    """`rul train`'s bar: nothing before an epoch ended, then the run in all and what is left
    at the mean time of this process's epochs (a resumed run counts only its own)."""
    from rul.training.members import estimate

    assert estimate((10.0, 0), 0, 12, 50.0) == ""
    assert estimate((0.0, 0), 2, 12, 20.0) == "  about 2.0 min for 12 epochs (1.7 min left)"
    assert estimate((100.0, 3), 5, 12, 120.0) == "  about 2.0 min for 12 epochs (1.2 min left)"


def test_a_trial_says_each_epoch_with_its_estimate_from_the_first_on(monkeypatch, capsys):
    """A line per epoch: the trial's time in all and left at its epochs' mean time, and the
    study's while no trial has ended; with several seeds, the seed's place."""
    from rul.tuning import progress

    clock = iter([100.0, 130.0, 150.0, 170.0])  # started; then the end of each epoch
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    watch = progress.TrialWatch()
    watch.say_epochs(4, 20, study_trials=8 / 2)
    watch.on_epoch(1, 10, {"val_rmse": 30.0})
    watch.on_epoch(2, 20, {"val_rmse": 21.456})
    assert capsys.readouterr().err.splitlines() == [
        "trial 4, epoch 1 of 20: val RMSE 30.00 (best 30.00); about 10.0 min for the trial "
        "(9.5 min left), the study about 40.0 min",
        "trial 4, epoch 2 of 20: val RMSE 21.46 (best 21.46); about 8.3 min for the trial "
        "(7.5 min left), the study about 33.3 min"]
    clock = iter([0.0, 60.0, 90.0, 120.0])
    watch = progress.TrialWatch()
    watch.say_epochs(5, 3, seeds=2)
    for epoch, rmse in ((1, 12.0), (2, 13.0)):  # the first seed stopped early, at 2
        watch.on_epoch(epoch, epoch, {"val_rmse": rmse})
    watch.start_seed()
    watch.on_epoch(1, 1, {"val_rmse": 14.0})
    assert capsys.readouterr().err.splitlines()[-1] == (
        "trial 5, seed 2 of 2, epoch 1 of 3: val RMSE 14.00 (best 14.00); about 3.3 min for "
        "the trial (1.3 min left)")  # 2 + 3 epochs at 40 s


def test_a_trial_without_a_plan_says_no_epoch(capsys):
    from rul.tuning import progress

    watch = progress.TrialWatch()
    watch.on_epoch(1, 10, {"val_rmse": 30.0})
    assert capsys.readouterr().err == ""


def test_a_trial_s_end_says_its_state_epochs_best_rmse_and_time(monkeypatch):
    from rul.tuning import progress

    monkeypatch.setattr(progress.time, "monotonic", lambda: 100.0)
    watch = progress.TrialWatch()
    for epoch, rmse in ((1, 30.0), (2, 21.456), (3, 25.0)):
        watch.on_epoch(epoch, 10 * epoch, {"val_rmse": rmse})
    monkeypatch.setattr(progress.time, "monotonic", lambda: 283.4)
    assert progress.ended_line(7, "pruned", watch, "pruned at epoch 3: val_rmse 25.000") == (
        "trial 7: pruned (pruned at epoch 3: val_rmse 25.000), 3 epochs, best val RMSE 21.46, "
        "183 s")
    assert progress.ended_line(7, "complete", watch) == (
        "trial 7: complete, 3 epochs, best val RMSE 21.46, 183 s")


def test_a_trial_of_several_seeds_ends_saying_each_seed_and_their_mean(monkeypatch):
    from rul.tuning import progress

    monkeypatch.setattr(progress.time, "monotonic", lambda: 100.0)
    watch = progress.TrialWatch()
    for curve in (((1, 12.0), (2, 11.0)), ((1, 14.0), (2, 13.5), (3, 13.0))):
        watch.start_seed()
        for epoch, rmse in curve:
            watch.on_epoch(epoch, 10 * epoch, {"val_rmse": rmse})
    monkeypatch.setattr(progress.time, "monotonic", lambda: 1512.0)
    assert progress.ended_line(3, "complete", watch) == (
        "trial 3: complete, 2 seeds of 2 / 3 epochs, val RMSE 12.00 (best of each: 11.00 / "
        "13.00), 1412 s")
    watch.start_seed()  # interrupted before the third seed's first epoch
    assert progress.ended_line(3, "interrupted (SIGINT)", watch) == (
        "trial 3: interrupted (SIGINT), 3 seeds of 2 / 3 / 0 epochs (best of each: 11.00 / "
        "13.00 / -), 1412 s")

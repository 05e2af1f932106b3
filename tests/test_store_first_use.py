"""A new SQLite store used by several processes at once: MLflow creates its tables on first use,
and processes doing that together used to fail (`duplicate column name`, alembic's "expected
to match one row"). rul.tracking.store makes one process at a time do it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
TINY = ["epochs=1", "patience=5", "window=20", "filters=4", "num_layers=2", "hidden_size=8",
        "micro_batch_size=64", "accumulation_steps=1", "register=false"]


def run_together(commands, cwd: Path, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    processes = [subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for c in commands]
    done = []
    for command, process in zip(commands, processes, strict=True):
        out, err = process.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(command, process.returncode, out, err))
    return done


@pytest.mark.slow
def test_two_trainings_started_at_once_on_a_new_store_both_finish(write_cmapss, tmp_path):
    data_dir = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55, 49, 58, 44, 50))
    work = tmp_path / "work"
    work.mkdir()
    commands = [[sys.executable, "-m", "rul", "train", *TINY, f"seed={seed}",
                 f"data_dir={data_dir}", "--no-progress"] for seed in (1, 2)]
    results = run_together(commands, work)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
    client = MlflowClient(f"sqlite:///{work}/mlflow.db")
    experiment = client.get_experiment_by_name("rul-fd001")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["seed"] for r in runs) == ["1", "2"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(p.name for p in work.iterdir()) == ["mlflow.db", "mlruns"]  # no lock file



def test_trainings_in_two_folders_of_one_process_use_each_folder_s_store(write_cmapss, tmp_path,
                                                                          monkeypatch):
    """The default store is ./mlflow.db where the command runs: a second training in another
    folder of the same process (a notebook, a test) gets its own store, not the first one's
    (MLflow keeps one store per URI string, so rul hands it absolute SQLite paths)."""
    from click.testing import CliRunner

    from rul.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store
    data_dir = write_cmapss()
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        result = CliRunner().invoke(main, ["train", *TINY, f"data_dir={data_dir}",
                                           "register=false", "--no-progress"])
        assert result.exit_code == 0, result.output
    for folder in ("first", "second"):
        client = MlflowClient(f"sqlite:///{tmp_path / folder / 'mlflow.db'}")
        experiments = [e.experiment_id for e in client.search_experiments()]
        assert len(client.search_runs(experiments)) == 1, folder  # its own run, no other


def test_a_damaged_or_read_only_store_is_one_line_and_nothing_starts(write_cmapss, tmp_path,
                                                                      monkeypatch):
    from click.testing import CliRunner

    from rul.cli import main
    from rul.tracking import store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store
    data_dir = write_cmapss()
    monkeypatch.chdir(tmp_path)
    args = ["train", *TINY, f"data_dir={data_dir}", "--no-progress"]
    assert CliRunner().invoke(main, args).exit_code == 0  # a store with one run
    database = tmp_path / "mlflow.db"
    saved = database.read_bytes()
    database.write_bytes(saved[: len(saved) // 2])  # cut in half
    store._ready.clear()  # a new process would check it again
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "Error: tracking store mlflow.db: the file is damaged (SQLite: database disk image is "
        "malformed); restore it from a backup, or move it away to start a new store"]

    database.write_bytes(saved)
    store._ready.clear()
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path).name != "mlflow.db")
    result = CliRunner().invoke(main, args)  # as another user would meet it (not root)
    assert result.exit_code == 2, result.output
    assert result.output.strip().endswith(
        "is read-only for this user; make it writable, or track to another store "
        "(tracking_uri=...)")
    assert len(MlflowClient(f"sqlite:///{database}").search_runs(
        [MlflowClient(f"sqlite:///{database}").get_experiment_by_name("rul-fd001")
         .experiment_id])) == 1  # nothing started

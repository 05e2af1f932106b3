"""A store and checkpoints on a small filesystem that fills up, then a read-only one: one line,
nothing half-written, and the run resumes once there is space (needs `mount`: root, or sudo
without a password; skipped elsewhere)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

TINY = ["epochs=3", "filters=4", "num_layers=2", "hidden_size=8", "window=20",
        "micro_batch_size=64", "accumulation_steps=1", "register=false"]


def _mount(*args) -> bool:
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return False
    return subprocess.run([*sudo, "mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    folder = tmp_path / "small"
    folder.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(folder)):
        pytest.skip("cannot mount a small tmpfs here (needs root or sudo)")
    try:
        yield folder
    finally:
        _mount("-o", "remount,rw", str(folder))
        subprocess.run(["umount", "-l", str(folder)] if os.geteuid() == 0 else
                       ["sudo", "-n", "umount", "-l", str(folder)], capture_output=True)


def rul(args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rul", "train", *args, "--no-progress"],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_full_then_read_only_disk(small_disk, write_cmapss, tmp_path):
    data = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55, 49, 58, 44, 50))
    args = [*TINY, f"data_dir={data}", f"checkpoint_dir={small_disk}/ckpt",
            f"tracking_uri=sqlite:///{small_disk}/mlflow.db"]
    assert rul([*args, "epochs=1"], tmp_path).returncode == 0  # the store exists
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - 96 * 1024))  # 96 KiB left
    full = rul(args, tmp_path)
    said = [line for line in full.stderr.strip().splitlines()  # the tiny data's own warnings
            if not line.startswith("warning: ") or "engines" not in line]
    assert full.returncode == 1, full.stderr[-2000:]
    assert said[-1].startswith("Error: no space left on the device of "), said[-3:]
    assert "Traceback" not in full.stderr and len(said) <= 4, said
    assert not list(small_disk.rglob("*.part"))

    (small_disk / "filler").unlink()  # space freed: the run goes on, or is closed and redone
    again = rul([*args, "--resume"], tmp_path)
    if again.returncode == 2 and "nothing to resume" in again.stderr:
        again = rul(args, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]

    assert _mount("-o", "remount,ro", str(small_disk))  # before this process opens the store
    refused = rul([*args, "epochs=1"], tmp_path)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].endswith(
        "is read-only for this user; make it writable, or track to another store "
        "(tracking_uri=...)")
    assert _mount("-o", "remount,rw", str(small_disk))

    client = MlflowClient(f"sqlite:///{small_disk}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("rul-fd001").experiment_id])
    assert "RUNNING" not in [r.info.status for r in runs]
    assert [r.info.status for r in runs].count("FINISHED") == 2  # the first one, and this


@pytest.mark.slow
def test_a_disk_that_fills_while_a_new_store_is_created_leaves_nothing_half_built(
        small_disk, write_cmapss, tmp_path):
    """The store's tables need about 1 MB: on 400 KB the creation stops half-way. One line,
    no store and no leftover; once there is room, the same command trains."""
    data = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55, 49, 58, 44, 50))
    assert _mount("-o", "remount,size=400k", str(small_disk))
    args = [*TINY, "epochs=1", f"data_dir={data}", f"checkpoint_dir={tmp_path}/ckpt",
            f"tracking_uri=sqlite:///{small_disk}/mlflow.db"]
    full = rul(args, tmp_path)
    said = [line for line in full.stderr.strip().splitlines()  # the tiny data's own warnings
            if not line.startswith("warning: ") or "engines" not in line]
    assert full.returncode == 1, full.stderr[-2000:]
    assert said[-1] == ("Error: no space left on the device of the tracking store: free some, "
                        "then run the command again (a run with a checkpoint continues with "
                        "--resume)"), said[-3:]
    assert "Traceback" not in full.stderr and len(said) <= 3, said
    assert list(small_disk.iterdir()) == []  # no half-built store, nothing aside

    assert _mount("-o", "remount,size=8m", str(small_disk))
    again = rul(args, tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.slow
def test_a_disk_that_fills_while_the_model_is_logged_is_a_few_lines(small_disk, write_cmapss):
    """Training fits, the model's artifacts do not (the store and ./mlruns on the small disk):
    a few lines, no traceback nor MLflow's logged ones, and the next command closes the run
    (its model FAILED) and trains."""
    from mlflow.entities import LoggedModelStatus

    data = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55, 49, 58, 44, 50))
    args = [*TINY, "epochs=1", f"data_dir={data}", f"checkpoint_dir={small_disk.parent}/ckpt"]
    assert rul(args, small_disk).returncode == 0  # the store exists
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - 400 * 1024))  # 400 KiB left
    full = rul(args, small_disk)
    said = [line for line in full.stderr.strip().splitlines()  # the tiny data's own warnings
            if not line.startswith("warning: ") or "engines" not in line]
    assert full.returncode == 1, full.stderr[-2000:]
    assert said[-1].startswith("Error: no space left on the device of "), said[-3:]
    assert "Traceback" not in full.stderr and "ERROR mlflow" not in full.stderr
    assert len(said) <= 3, said
    (small_disk / "filler").unlink()

    again = rul(args, small_disk)
    assert again.returncode == 0, again.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{small_disk}/mlflow.db")
    experiment = client.get_experiment_by_name("rul-fd001").experiment_id
    runs = client.search_runs([experiment])
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED", "FINISHED"] or \
        sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED", "KILLED"]
    models = client.search_logged_models([experiment])
    assert LoggedModelStatus.PENDING not in [m.status for m in models]

"""Checkpoints that can be trusted: verified on load, written so that a crash leaves the
previous good one, and `--resume` that falls back to it or says plainly the run must start
over (one line, exit 2, no damaged file left, the run not left RUNNING).

Synthetic C-MAPSS files and a tiny model: each training takes a second or two.
"""

import hashlib
import io
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import unwarned
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.cli import main
from rul.data.sources import sha256_of
from rul.plan import plan_run
from rul.tracking.run_checkpoints import CannotResume, RunCheckpoints
from rul.tracking.store import open_store
from rul.training import checkpoint
from rul.training.checkpoint import CheckpointDamaged, Checkpointer
from rul.training.listener import TrainingListener
from rul.workflows.tracked import RunRole, track
from rul.workflows.train import train_tracked

ROOT = Path(__file__).resolve().parents[1]
TRAIN_LENGTHS = (52, 60, 35, 47, 41, 55, 49, 58, 44, 50)
TINY = ["epochs=4", "patience=10", "window=20", "filters=4", "num_layers=2", "hidden_size=8",
        "micro_batch_size=64", "accumulation_steps=1", "register=false"]


# ---------------------------------------------------------------- the file


def plain_state(epoch: int = 1, weights=None) -> dict:
    """The plain data Checkpointer.save writes after `epoch` epochs, its tensors small."""
    from rul.training.state import TrainState

    weights = {"w": torch.zeros(2) if weights is None else weights}
    progress = {**TrainState().as_dict(), "epoch": epoch, "step": 2 * epoch,
                "best_epoch": epoch, "best_val_rmse": 14.5, "best_weights": weights,
                "history": [{"val_rmse": 14.5, "train_loss_epoch": 200.0}] * epoch,
                "grad_norms": [1.0] * 2 * epoch}
    return {"model": weights, "optimizer": {"state": {}, "param_groups": []},
            "precision": "fp32", "scaler": {}, "scheduler": None, "ema": None,
            "train_state": progress, "rng": checkpoint.rng_state()}


def test_a_checkpoint_reads_back_what_was_saved(tmp_path):
    state = plain_state(3, torch.arange(10.0))
    checkpoint.save(tmp_path / "run.pt", state)
    loaded = checkpoint.load(tmp_path / "run.pt")
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["train_state"]["epoch"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_checkpoint_is_detected_before_it_is_used(tmp_path, damage):
    path = tmp_path / "run.pt"
    checkpoint.save(path, {"weights": torch.randn(1000)})
    data = bytearray(path.read_bytes())
    if damage == "truncate":  # a full disk, or a crash mid-write on a filesystem that lies
        data = data[: len(data) // 2]
    elif damage == "flip":  # one bit in the tensor's bytes: torch.load alone would not see it
        data[len(data) // 2] ^= 0x01
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not a checkpoint at all")
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointDamaged) as error:
        checkpoint.load(path)
    assert str(error.value).startswith(f"checkpoint {path} is damaged: ")
    assert "\n" not in str(error.value)


def test_a_checkpoint_of_an_older_rul_without_digest_still_loads(tmp_path):
    torch.save(plain_state(2), tmp_path / "old.pt")
    assert checkpoint.load(tmp_path / "old.pt")["train_state"]["epoch"] == 2


def test_the_previous_checkpoint_is_kept_and_a_crash_mid_write_leaves_it(tmp_path,
                                                                         monkeypatch):
    path = tmp_path / "run.pt"
    checkpoint.save(path, plain_state(1))
    checkpoint.save(path, plain_state(2))
    assert checkpoint.load(path)["train_state"]["epoch"] == 2
    assert checkpoint.load(checkpoint.previous(path))["train_state"]["epoch"] == 1

    def crash(*args, **kwargs):  # the process dies while the new file is written
        raise OSError("No space left on device")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        checkpoint.save(path, plain_state(3))
    assert checkpoint.load(path)["train_state"]["epoch"] == 2  # the good one is untouched
    monkeypatch.undo()
    Checkpointer(path).remove()
    assert list(tmp_path.iterdir()) == []  # the newest, the previous and the partial one


class RunsCode:
    """What an attacker pickles: unpickling it calls os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted(path: Path, marker: Path, header: bytes | None) -> None:
    """A checkpoint whose unpickling would run a command, with a valid digest under `header`
    (today's, an earlier rul's) or none (torch.save's bare zip)."""
    buffer = io.BytesIO()
    torch.save({"model": {}, "train_state": RunsCode(marker)}, buffer)
    payload = buffer.getvalue()
    path.write_bytes(payload if header is None
                     else header + hashlib.sha256(payload).digest() + payload)


@pytest.mark.parametrize("header", [checkpoint.MAGIC, checkpoint.LEGACY_MAGIC, None],
                         ids=["today", "earlier", "bare-zip"])
def test_a_crafted_checkpoint_runs_nothing_and_is_refused_in_one_line(tmp_path, header):
    path, marker = tmp_path / "run.pt", tmp_path / "ran"
    crafted(path, marker, header)
    with pytest.raises(checkpoint.CheckpointRefused) as error:
        checkpoint.load(path)
    assert not marker.exists()  # nothing ran
    said = str(error.value)
    assert said.startswith(f"checkpoint {path} is refused: it holds objects that are not "
                           "tensors or plain data (posix.system), which rul never writes; "
                           "nothing in it was run.")
    assert "\n" not in said and path.exists()  # left as it is: the user decides


def test_what_the_trainer_writes_loads_with_torchs_weights_only_unpickler_alone(synthetic):
    """No allowance: tensors, dicts, lists, numbers and strings, the random states included."""
    store, args, config = synthetic
    path = RunCheckpoints(config.checkpoint_dir).path(interrupted_run(config))
    data = path.read_bytes()
    assert data.startswith(checkpoint.MAGIC)
    state = torch.load(io.BytesIO(data[len(checkpoint.MAGIC) + checkpoint.DIGEST_SIZE:]),
                       weights_only=True)
    assert state["train_state"]["epoch"] == 2 and state["rng"]["numpy"]["key"].numel() == 624


def test_a_checkpoint_of_the_earlier_format_is_read_safely_and_resumes(synthetic, monkeypatch):
    """An earlier rul pickled its TrainState (as rul.training.engine.TrainState) and numpy's
    random state: read with those two allowed and nothing else, and the run goes on."""
    import numpy as np

    from rul.training.state import TrainState

    store, args, config = synthetic
    run_id = interrupted_run(config)
    path = RunCheckpoints(config.checkpoint_dir).path(run_id)
    state = checkpoint.load(path)
    numpy_state = np.random.get_state()
    state["train_state"] = TrainState.from_dict(state["train_state"])
    state["rng"]["numpy"] = numpy_state
    monkeypatch.setattr(TrainState, "__module__", "rul.training.engine")  # its name then
    buffer = io.BytesIO()
    torch.save(state, buffer)
    monkeypatch.undo()
    payload = buffer.getvalue()
    assert b"rul.training.engine" in payload and b"numpy" in payload
    path.write_bytes(checkpoint.LEGACY_MAGIC + hashlib.sha256(payload).digest() + payload)

    loaded = checkpoint.load(path)
    assert loaded["train_state"]["epoch"] == 2
    checkpoint.restore_rng_state(loaded["rng"])
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), numpy_state,
                                                    strict=True))
    result = resume(args)
    assert result.exit_code == 0, result.output
    assert MlflowClient(store.uri).get_run(run_id).info.status == "FINISHED"


def test_resume_from_a_crafted_checkpoint_runs_nothing_and_ends_in_one_line(synthetic):
    store, args, config = synthetic
    run_id = interrupted_run(config)
    path = RunCheckpoints(config.checkpoint_dir).path(run_id)
    marker = path.parent / "ran"
    crafted(path, marker, checkpoint.MAGIC)
    result = resume(args)
    assert result.exit_code == 2, result.output
    assert not marker.exists()
    assert result.stderr.startswith(f"Error: checkpoint {path} is refused: ")
    assert result.stderr.count("\n") == 1
    assert path.exists()  # evidence kept; the run stays as it was
    assert MlflowClient(store.uri).get_run(run_id).info.status == "KILLED"


def _forged(state: dict, change: str) -> str:
    """`state` changed as a hand-edited checkpoint would be; what rul says is wrong."""
    progress = state["train_state"]
    if change == "epoch":  # its history made to agree: only the run's epochs refuse it
        progress["epoch"] = 5
        progress["history"] = progress["history"] * 3
        del progress["history"][5:]
        return "its train_state.epoch 5 is beyond the run's 4 epochs"
    if change == "million":
        progress["epoch"] = 10**6
        return "its train_state.history is not 1000000 epochs of numbers"
    if change in ("negative", "nan"):
        progress["best_val_rmse"] = -1.0 if change == "negative" else math.nan
        return f"its train_state.best_val_rmse is {progress['best_val_rmse']!r}, not a finite " \
               "RMSE >= 0"
    if change == "history":
        del progress["history"]
        return "its train_state lacks history"
    del state["optimizer"]
    return "it lacks optimizer"


@pytest.mark.parametrize("change", ["epoch", "million", "negative", "nan", "history",
                                    "optimizer"])
def test_resume_from_plain_data_rul_never_writes_ends_in_one_line(synthetic, change):
    """A checkpoint with a valid digest whose plain data claims an epoch beyond the run, a
    negative or NaN validation RMSE, or lacks a key: exit 2, one line saying which; the run is
    neither trained on nor registered."""
    store, args, config = synthetic
    run_id = interrupted_run(config)
    path = RunCheckpoints(config.checkpoint_dir).path(run_id)
    state = checkpoint.load(path)
    said = _forged(state, change)
    checkpoint.save(path, state)
    checkpoint.previous(path).unlink()  # no earlier checkpoint to fall back on
    result = resume(args)
    assert result.exit_code == 2, result.output
    assert said in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    run = MlflowClient(store.uri).get_run(run_id)
    assert run.info.status == "KILLED" and "registered_model" not in run.data.tags


# ---------------------------------------------------------------- --resume


class InterruptAtEpoch(TrainingListener):
    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch(self, epoch, step, metrics):
        if epoch == self.epoch:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def module_store(tmp_path_factory, mlflow_store_at):
    """One store and one synthetic C-MAPSS folder for the module (a store's first use costs
    seconds); each test trains its own config (seed), so `--resume` finds only its runs."""
    from conftest import frame_to_text, synthetic_frame

    root = tmp_path_factory.mktemp("checkpoints")
    data_dir = root / "cmapss"
    data_dir.mkdir()
    (data_dir / "train_FD001.txt").write_text(frame_to_text(synthetic_frame(TRAIN_LENGTHS)))
    (data_dir / "test_FD001.txt").write_text(frame_to_text(synthetic_frame((31, 45, 38), 1)))
    (data_dir / "RUL_FD001.txt").write_text("10 \n17 \n24 \n")
    with mlflow_store_at(root) as store:
        store.data_dir = data_dir
        yield store


@pytest.fixture
def synthetic(module_store, request):
    """The store, the `rul train` arguments of a tiny synthetic run of this test's own
    config (seed and checkpoint folder), and that config."""
    seed = 1000 + sum(map(ord, request.node.name))
    args = [*TINY, f"seed={seed}", f"tracking_uri={module_store.uri}",
            f"checkpoint_dir={module_store.root / request.node.name}",
            f"data_dir={module_store.data_dir}"]
    return module_store, args, cfg.load(None, args)


def interrupted_run(config, at_epoch: int = 2) -> str:
    """A run stopped after `at_epoch` epochs (KILLED, its checkpoints kept); its id."""
    created = []
    with pytest.raises(KeyboardInterrupt):
        track(plan_run(config), RunRole(register=False, on_run_created=created.append),
              open_store(config), InterruptAtEpoch(at_epoch), progress=False)
    return created[0]


def left_running(client, run_id: str) -> None:
    """Run `run_id` as a process killed with SIGKILL leaves it: RUNNING, its owner gone."""
    import socket

    from rul.tracking.run_owner import OWNER_TAG

    gone = subprocess.Popen(["true"])
    gone.wait()
    client.set_tag(run_id, OWNER_TAG, f"{socket.gethostname()} {gone.pid} 1.00")
    client.update_run(run_id, status="RUNNING")


def _left_running(store, config):
    """(client, run): the seed's run, RUNNING because the store could not take its end, and
    marked as its process having ended."""
    client = MlflowClient(store.uri)
    (run,) = client.search_runs(
        [client.get_experiment_by_name(config.experiment_name).experiment_id],
        filter_string=f"params.seed = '{config.seed}'")
    assert run.info.status == "RUNNING"  # the store could not take it
    left_running(client, run.info.run_id)  # and its process ended
    return client, run


def resume(args, *more):
    return CliRunner().invoke(main, ["train", *args, "--no-progress", "--resume", *more])


def files_of(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_run_resumes_its_random_streams_whatever_device_it_trains_on(synthetic, monkeypatch):
    """A checkpoint is read onto the CPU, not onto the run's device: torch.set_rng_state takes
    only a CPU ByteTensor (on CUDA, reading it onto the GPU made --resume fail). The meta device
    stands in for a GPU here, so the test runs on any machine."""
    import rul.plan

    store, args, config = synthetic
    run_id = interrupted_run(config)
    path = RunCheckpoints(config.checkpoint_dir).path(run_id)
    monkeypatch.setattr(rul.plan, "resolve_device", lambda device: torch.device("meta"))
    plan = plan_run(config, rul.plan.ResumeTarget(path, run_id))
    assert plan.device.type == "meta"
    rng = plan.resume["rng"]
    assert rng["torch"].device.type == "cpu" and rng["torch"].dtype == torch.uint8
    checkpoint.restore_rng_state(rng)
    tensors = [v for v in plan.resume["model"].values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


def test_resume_falls_back_to_the_previous_checkpoint_when_the_newest_is_damaged(synthetic):
    store, args, config = synthetic
    run_id = interrupted_run(config)
    newest = RunCheckpoints(config.checkpoint_dir).path(run_id)
    newest.write_bytes(newest.read_bytes()[:1000])  # cut short

    result = resume(args)
    assert result.exit_code == 0, result.output
    assert (f"run {run_id}: its newest checkpoint is damaged (its SHA-256 does not match: cut "
            "short or changed after it was written); resuming from the one before it, after "
            "epoch 1\n") in result.stderr
    assert "resuming from the one before it, after epoch 1\n" in result.stderr
    assert f"resuming run {run_id} after epoch 1" in result.stderr
    run = MlflowClient(store.uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["rul.checkpoint"] == (
        "the newest damaged (its SHA-256 does not match: cut short or changed after it was "
        "written): resumed from the one before it (epoch 1)")
    assert files_of(newest.parent) == []  # finished: nothing left


@pytest.mark.parametrize("status", ["KILLED", "RUNNING"])
def test_resume_says_plainly_that_a_run_without_an_intact_checkpoint_must_start_over(
        synthetic, status):
    """RUNNING: what a process killed with SIGKILL leaves."""
    store, args, config = synthetic
    run_id = interrupted_run(config)
    client = MlflowClient(store.uri)
    client.update_run(run_id, status=status)
    newest = RunCheckpoints(config.checkpoint_dir).path(run_id)
    for path in (newest, checkpoint.previous(newest)):
        path.write_bytes(path.read_bytes()[:-10])

    result = resume(args)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"Error: --resume: run {run_id} cannot be continued: its checkpoint {newest} is damaged "
        "(its SHA-256 does not match: cut short or changed after it was written) and no "
        "earlier one is intact (the files were removed); start the run over: the same command "
        "without --resume\n")
    assert files_of(newest.parent) == []  # no damaged file, no lock left behind
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"  # as it was, or what its killed process could not say
    assert run.data.tags["rul.checkpoint"].startswith("damaged (its SHA-256 does not match")
    again = resume(args)  # and then there is nothing to resume
    assert again.exit_code == 2 and "nothing to resume" in again.stderr


@pytest.mark.parametrize("named", [False, True])
def test_resume_with_nothing_to_continue_creates_no_store(tmp_path, module_store, named):
    """A first `rul train --resume` in a new folder: one line, and no MLflow store (or
    checkpoint folder) made only to find it empty."""
    store = tmp_path / "mlflow.db"
    args = [*TINY, f"tracking_uri=sqlite:///{store}", f"data_dir={module_store.data_dir}",
            f"checkpoint_dir={tmp_path / 'checkpoints'}"]
    result = resume(args, *(["0123abcd"] if named else []))
    assert result.exit_code == 2, result.output
    assert result.stderr == ("Error: --resume 0123abcd: no checkpoint at "
                             f"{tmp_path / 'checkpoints' / '0123abcd.pt'}\n" if named else
                             "Error: nothing to resume: no unfinished run of this config has a "
                             f"checkpoint in {tmp_path / 'checkpoints'} (run without --resume "
                             "to start a new one)\n")
    assert files_of(tmp_path) == []


def test_resume_of_a_run_another_process_trains_touches_nothing(synthetic):
    store, args, config = synthetic
    run_id = interrupted_run(config)
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    with checkpoints.held(run_id):  # another process trains it right now
        result = resume(args, run_id)
        with pytest.raises(CannotResume, match="being trained by another process"):
            train_tracked(config, resume=run_id, progress=False)
    assert result.exit_code == 2
    assert result.stderr == (f"Error: --resume {run_id}: that run is being trained by another "
                             "process right now\n")
    assert MlflowClient(store.uri).get_run(run_id).info.status == "KILLED"  # not FAILED


def test_ctrl_c_in_the_first_epoch_promises_no_checkpoint(synthetic, monkeypatch):
    store, args, config = synthetic
    from rul.tracking.mlflow_listener import MLflowListener

    def interrupted(self, step, result):
        raise KeyboardInterrupt

    monkeypatch.setattr(MLflowListener, "on_step", interrupted)
    result = CliRunner().invoke(main, ["train", *args, "--no-progress"])
    assert result.exit_code == 130
    assert result.stderr.endswith(
        "interrupted: the run is marked KILLED; it stopped before its first epoch ended, so it "
        "has no checkpoint and nothing can be resumed: run the command again\n")
    assert "--resume" not in result.stderr
    (run,) = MlflowClient(store.uri).search_runs(
        [MlflowClient(store.uri).get_experiment_by_name(config.experiment_name).experiment_id],
        filter_string=f"params.seed = '{config.seed}'")
    assert run.info.status == "KILLED"
    assert files_of(Path(config.checkpoint_dir)) == []  # no lock file left either


def test_an_interrupted_run_whose_checkpoint_was_deleted_says_so(synthetic, monkeypatch):
    """Epoch 1 ended (and was logged), then the checkpoint was deleted, then Ctrl-C: the
    message names the epochs done and the missing file, not a first epoch that never ended."""
    store, args, config = synthetic
    from rul.tracking.mlflow_listener import MLflowListener

    logged_epoch = MLflowListener.on_epoch

    def delete_then_stop(self, epoch, step, metrics):
        logged_epoch(self, epoch, step, metrics)
        for path in Path(config.checkpoint_dir).glob(f"{self.run_id}.pt*"):
            path.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(MLflowListener, "on_epoch", delete_then_stop)
    result = CliRunner().invoke(main, ["train", *args, "--no-progress"])
    assert result.exit_code == 130
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: the run is marked KILLED; it finished 1 epoch(s) but "
                           "its checkpoint ") and "is gone, so nothing can be resumed" in last
    assert "before its first epoch" not in result.stderr


def test_a_full_disk_is_one_line_leaves_no_part_file_and_the_run_is_closed(synthetic,
                                                                          monkeypatch):
    """The epoch-2 checkpoint finds the disk full halfway, and so does marking the run FAILED:
    one line for each, no .part file left, and the next command closes the run."""
    import builtins
    import errno

    from mlflow.tracking import MlflowClient as Client

    store, args, config = synthetic
    real_open, saves = builtins.open, []

    def filling(path, mode="r", *rest, **kwargs):
        handle = real_open(path, mode, *rest, **kwargs)
        if str(path).endswith(".pt.part"):
            saves.append(path)
            if len(saves) == 2:  # the second epoch's checkpoint: half written, then full
                handle.write(b"x" * 1000)
                handle.close()
                raise OSError(errno.ENOSPC, "No space left on device")
        return handle

    def store_full(self, run_id, status="FINISHED", *rest, **kwargs):
        if status != "FINISHED":
            raise RuntimeError("(sqlite3.OperationalError) database or disk is full\n[SQL: ...]")
        return real_terminated(self, run_id, status, *rest, **kwargs)

    real_terminated = Client.set_terminated
    monkeypatch.setattr(builtins, "open", filling)
    monkeypatch.setattr(Client, "set_terminated", store_full)
    result = CliRunner().invoke(main, ["train", *args, "--no-progress"])
    monkeypatch.undo()
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: no space left on the device of ") and ".pt" in lines[-1]
    assert "could not be marked FAILED (RuntimeError: (sqlite3.OperationalError) database or " \
           "disk is full); the next rul command in this experiment closes it" in lines[-2]
    assert "Traceback" not in result.output
    assert not list(Path(config.checkpoint_dir).glob("*.part"))
    client, run = _left_running(store, config)
    other = [a for a in args if not a.startswith("seed=")] + [f"seed={config.seed + 7}"]
    again = CliRunner().invoke(main, ["train", *other, "--no-progress"])
    assert again.exit_code == 0, again.output
    assert client.get_run(run.info.run_id).info.status == "KILLED"


def test_the_next_command_closes_a_run_its_killed_process_left_running(synthetic, monkeypatch):
    """kill -9 leaves the run RUNNING (and a logged model PENDING): the next training in the
    experiment marks it KILLED and the model FAILED, says so in one line before it starts,
    and the killed run can still be resumed."""
    from mlflow.entities import LoggedModelStatus

    store, args, config = synthetic
    killed = interrupted_run(config)
    client = MlflowClient(store.uri)
    left_running(client, killed)  # what SIGKILL leaves: no clean-up ran
    experiment = client.get_run(killed).info.experiment_id
    pending = client.create_logged_model(experiment, name="model", source_run_id=killed)
    assert pending.status == LoggedModelStatus.PENDING
    other = [a for a in args if not a.startswith("seed=")] + [f"seed={config.seed + 1}"]
    result = CliRunner().invoke(main, ["train", *other, "--no-progress"])
    assert result.exit_code == 0, result.output
    said = next(line for line in result.stderr.splitlines() if line.startswith(f"run {killed} "))
    gone = f"run {killed} was left RUNNING by a process that is gone: marked KILLED (continue it "
    assert said.startswith(gone + "with: rul train experiments/fd001.yaml ") and said.endswith(
        f" --resume {killed})"), said
    assert client.get_run(killed).info.status == "KILLED"
    assert client.get_logged_model(pending.model_id).status == LoggedModelStatus.FAILED
    command = shlex.split(said.removeprefix(gone + "with: ").removesuffix(")"))
    monkeypatch.chdir(ROOT)  # where experiments/ is
    continued = CliRunner().invoke(main, [*command[1:], "--no-progress"])  # as said
    assert continued.exit_code == 0, (command, continued.output)
    assert client.get_run(killed).info.status == "FINISHED"


def test_a_run_killed_after_registering_keeps_one_version_and_takes_the_champion_once_done(
        synthetic):
    """kill -9 between registration and the run's end: its version never becomes champion
    while the run is unfinished; resumed and finished, it keeps that one version."""
    from rul.tracking.registry import register_and_promote

    store, args, config = synthetic
    client = MlflowClient(store.uri)
    registering = [a for a in args if a != "register=false"] + ["register=true"]
    first = [a for a in registering if not a.startswith("seed=")] + [f"seed={config.seed + 3}"]
    assert CliRunner().invoke(main, ["train", *first, "--no-progress"]).exit_code == 0
    champion = client.get_registered_model("rul-fd001").aliases["champion"]
    killed = interrupted_run(config)
    model = client.get_model_version("rul-fd001", champion).source
    register_and_promote(model, "rul-fd001", killed, 1e-3)  # it registered, then SIGKILL
    client.set_registered_model_alias("rul-fd001", "champion", champion)  # before the alias
    left_running(client, killed)
    later = [a for a in registering if not a.startswith("seed=")] + [f"seed={config.seed + 4}"]
    assert CliRunner().invoke(main, ["train", *later, "--no-progress"]).exit_code == 0
    killed_version = next(v.version for v in client.search_model_versions("name='rul-fd001'")
                          if v.tags.get("run_id") == killed)
    assert client.get_registered_model("rul-fd001").aliases["champion"] != killed_version
    assert client.get_run(killed).info.status == "KILLED"  # closed by that command

    assert resume(registering, killed).exit_code == 0
    versions = [v for v in client.search_model_versions("name='rul-fd001'")
                if v.tags.get("run_id") == killed]
    assert len(versions) == 1, [(v.version, v.run_id, v.tags) for v in versions]
    # finished, its version gains the evidence its run logged since, and competes on it
    finished = client.get_run(killed).data.tags
    assert versions[0].tags["selection.engines"] == finished["selection.engines"]
    assert client.get_registered_model("rul-fd001").aliases["champion"] == versions[0].version


@pytest.mark.parametrize("by_id", [False, True])
def test_resume_after_a_config_change_names_the_run_and_the_keys(synthetic, by_id,
                                                                 monkeypatch):
    """`--resume lr=0.01`: no unfinished run of that config, but one of the config it
    changed: the line names that run and the key, and how to resume it."""
    store, args, config = synthetic
    run_id = interrupted_run(config)
    result = resume([*args, "lr=0.01", "epochs=6"], *([run_id] if by_id else []))
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert f"run {run_id} has a checkpoint but trained " in line
    assert f"lr={config.lr} (this command: 0.01)" in line and "epochs=4 (this command: 6)" in line
    assert line.endswith(f"--resume {run_id}") and "resume it with: rul train " in line
    monkeypatch.chdir(ROOT)  # where experiments/ is
    command = shlex.split(line.partition("resume it with: ")[2])
    resumed = CliRunner().invoke(main, [*command[1:], "--no-progress"])
    assert resumed.exit_code == 0, (command, resumed.output)  # resumed as it said


def test_two_trainings_at_once_are_said_and_ctrl_c_names_the_run_to_resume(synthetic,
                                                                           monkeypatch):
    """A training started while another of its config trains in the store names that run;
    Ctrl-C of it prints the exact command, which continues this run, not the other. With both
    unfinished, a bare `--resume` names them and asks for one."""
    from rul.tracking.mlflow_listener import MLflowListener
    from rul.tracking.run_owner import reopen

    store, args, config = synthetic
    client, checkpoints = MlflowClient(store.uri), RunCheckpoints(config.checkpoint_dir)
    other = interrupted_run(config, at_epoch=1)
    reopen(client, other)  # another process trains it now: RUNNING, its owner alive, held
    with checkpoints.held(other):
        monkeypatch.setattr(MLflowListener, "on_epoch", InterruptAtEpoch(1).on_epoch)
        result = CliRunner().invoke(main, ["train", *args, "--no-progress"])
        monkeypatch.undo()
    assert result.exit_code == 130
    (mine,) = [r.info.run_id for r in client.search_runs(
        [client.get_run(other).info.experiment_id], filter_string=f"params.seed = '{config.seed}'")
        if r.info.run_id != other]
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("note: ")] == [
        f"note: run {other} (started {started(client, other)}, 1 epochs done) of this config is "
        "training in this store too; both go on, each its own run and checkpoint"]
    said = "interrupted: the run is marked KILLED and its checkpoint kept; continue it with: "
    assert lines[-1] == said + shlex.join(["rul", "train", *args, "--resume", mine])
    client.set_terminated(other, status="KILLED")  # the other stopped too: two to resume
    bare = resume(args)
    assert bare.exit_code == 2 and "Traceback" not in bare.output
    refused = bare.stderr.strip().splitlines()[-1]
    assert refused.startswith("Error: --resume: 2 unfinished runs of this config can be "
                              f"continued: {mine} (started {started(client, mine)}, ")
    assert f"; {other} (started {started(client, other)}, 1 epochs done); name one: --resume " \
           "RUN_ID" in refused
    again = CliRunner().invoke(main, [*shlex.split(lines[-1].removeprefix(said))[1:],
                                      "--no-progress"])
    assert again.exit_code == 0, again.output
    assert client.get_run(mine).info.status == "FINISHED"
    assert client.get_run(other).info.status == "KILLED" and checkpoints.has_checkpoint(other)


def started(client, run_id: str) -> str:
    return datetime.fromtimestamp(client.get_run(run_id).info.start_time / 1000).strftime(
        "%Y-%m-%d %H:%M")


@pytest.mark.slow
def test_a_run_killed_with_sigkill_and_its_checkpoints_cut_short_must_start_over(synthetic):
    """Real processes: SIGKILL while training, both checkpoint files cut short, `--resume`."""
    store, args, config = synthetic
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "rul", "train", *args, "epochs=400", "patience=400",
               "--no-progress"]
    folder = Path(config.checkpoint_dir)
    first = subprocess.Popen(command, cwd=store.root, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(folder.glob("*.pt.prev")):  # two epochs saved
        assert first.poll() is None, first.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.communicate()
    (newest,) = folder.glob("*.pt")
    run_id, client = newest.stem, MlflowClient(store.uri)
    assert client.get_run(run_id).info.status == "RUNNING"  # nobody could say otherwise
    for path in (newest, checkpoint.previous(newest)):
        path.write_bytes(path.read_bytes()[:-100])

    resumed = subprocess.run([*command, "--resume"], cwd=store.root, env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 2
    assert resumed.stderr == (
        f"Error: --resume: run {run_id} cannot be continued: its checkpoint {newest} is damaged "
        "(its SHA-256 does not match: cut short or changed after it was written) and no "
        "earlier one is intact (the files were removed); start the run over: the same command "
        "without --resume\n")
    assert files_of(folder) == []
    assert client.get_run(run_id).info.status == "KILLED"


def test_resume_on_changed_data_is_one_line_unless_asked_for_and_then_records_both(
        synthetic, tmp_path):
    """The run's files are compared with what it started on: a changed file names itself,
    exit 2, the run untouched; `--new-data` continues and the run records both digests."""
    import shutil

    store, args, config = synthetic
    run_id = interrupted_run(config)
    changed = tmp_path / "changed"
    shutil.copytree(store.data_dir, changed)
    train = changed / "train_FD001.txt"
    train.write_text(train.read_text().replace("\n", " \n", 1))  # one byte more
    args = [*args, f"data_dir={changed}"]
    before = MlflowClient(store.uri).get_run(run_id).data.tags["data.sha256.train"]

    result = resume(args)
    assert result.exit_code == 2, result.output
    (line,) = unwarned(result.stderr)
    assert line.startswith(f"Error: --resume: {train} changed since run {run_id} "
                           f"started (SHA-256 {before[:12]}... then, ")
    assert line.endswith("continue on it on purpose with --new-data (the run records "
                         "both), or start a new run without --resume")
    run = MlflowClient(store.uri).get_run(run_id)
    assert run.info.status == "KILLED" and "data.resumed" not in run.data.tags
    assert RunCheckpoints(config.checkpoint_dir).has_checkpoint(run_id)

    result = resume(args, "--new-data")
    assert result.exit_code == 0, result.output
    tags = MlflowClient(store.uri).get_run(run_id).data.tags
    assert tags["data.sha256.train"] == before
    assert tags["data.sha256.train.resumed"] == sha256_of(train)
    assert tags["data.resumed"] == "after epoch 2 on changed files: train_FD001.txt"
    assert CliRunner().invoke(main, ["train", *args, "--new-data"]).exit_code == 2


def test_a_run_whose_process_is_gone_is_closed_by_the_next_command_lock_or_none(synthetic):
    """A run killed before its first checkpoint, or whose checkpoint folder was deleted, has
    no lock to tell; its owner tag says which process trained it. `--resume` with nothing to
    continue still closes it; a run of a live process, or of another machine, is left."""
    from rul.tracking.run_owner import OWNER_TAG, owner_tags

    store, args, config = synthetic
    open_store(config)
    client = MlflowClient(store.uri)
    experiment = client.get_experiment_by_name(config.experiment_name).experiment_id
    tags = {"ghost": {}, "alive": owner_tags(), "elsewhere": {OWNER_TAG: "another-machine 1 1"}}
    runs = {name: client.create_run(experiment, tags=t).info.run_id for name, t in tags.items()}
    left_running(client, runs["ghost"])

    result = resume(args)  # nothing to resume: it says so, and the store is tidied first
    assert result.exit_code == 2 and "nothing to resume" in result.stderr, result.output
    assert (f"run {runs['ghost']} was left RUNNING by a process that is gone: marked KILLED\n"
            in result.stderr)
    assert {name: client.get_run(run).info.status for name, run in runs.items()} == {
        "ghost": "KILLED", "alive": "RUNNING", "elsewhere": "RUNNING"}
    for run in runs.values():
        client.set_terminated(run)


def test_a_store_that_turns_read_only_mid_run_is_one_line_and_resume_logs_every_epoch(
        synthetic, monkeypatch):
    """The store refuses writes from epoch 2's metrics on (remounted read-only): one line,
    exit 1; the run cannot be marked, so the next command closes it; `--resume` continues
    from epoch 2's checkpoint and logs epoch 2's metrics, which the store missed."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient as Client

    store, args, config = synthetic
    real_batch = Client.log_batch
    refusal = "(sqlite3.OperationalError) attempt to write a readonly database\n[SQL: INSERT]"

    def read_only_from_epoch_2(self, run_id, metrics=(), *rest, **kwargs):
        if any(m.key == "epoch" and m.value >= 2 for m in metrics):
            monkeypatch.setattr(Client, "set_terminated", refuse)
            monkeypatch.setattr(Client, "set_tag", refuse)
            raise MlflowException(refusal)
        return real_batch(self, run_id, metrics, *rest, **kwargs)

    def refuse(*args, **kwargs):
        raise MlflowException(refusal)

    monkeypatch.setattr(Client, "log_batch", read_only_from_epoch_2)
    result = CliRunner().invoke(main, ["train", *args, "--no-progress"])
    monkeypatch.undo()
    assert result.exit_code == 1, result.output
    lines = unwarned(result.stderr)
    assert lines[-1] == ("Error: the tracking store cannot be written (SQLite: a readonly "
                         "database): make it writable, then run the command again (a run with a "
                         "checkpoint continues with --resume)")
    assert len(lines) <= 3 and "Traceback" not in result.output, lines
    client, run = _left_running(store, config)

    again = resume(args)
    assert again.exit_code == 0, again.output
    epochs = [m.value for m in client.get_metric_history(run.info.run_id, "epoch")]
    assert sorted(epochs) == [1.0, 2.0, 3.0, 4.0]
    assert len(client.get_metric_history(run.info.run_id, "val/rmse")) == 4

"""Checkpoints belong to a run: `<checkpoint_dir>/<run_id>.pt`, locked while a process trains it.

Two runs of one config never share a file, and may train at once (a new one names the others
in one line). `--resume` continues the run it is given, or the one unfinished run of the config
whose checkpoint exists and that no live process holds (an flock, freed even by SIGKILL); with
more than one it names them all and asks for one (CannotResume). Its checkpoint is verified
first: a damaged newest file gives way to
the one before it, said in one line; with none intact its files are removed and CannotResume
says so. A run left RUNNING by a process that is gone (rul.tracking.run_owner) is marked KILLED
by the next command that tracks to the experiment (`close_abandoned`) (docs: When things go
wrong).
"""

import fcntl
import os
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from mlflow.tracking import MlflowClient

from rul.config.recipes import train_command
from rul.errors import ConfigError, InputError
from rul.tracking.run_owner import owner_alive
from rul.tracking.run_params import config_from_params
from rul.training import checkpoint
from rul.training.checkpoint import CheckpointDamaged, Checkpointer

CHECKPOINT_TAG = "rul.checkpoint"  # why a run's checkpoint was given up


def run_text(run) -> str:
    """e.g. `3f2a… (started 2026-12-02 04:10, 3 epochs done)`: a run told apart from others
    of its config."""
    started = datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")
    return (f"{run.info.run_id} (started {started}, "
            f"{int(run.data.metrics.get('epoch', 0))} epochs done)")


def resume_command(run) -> str:
    """The command that continues `run`: its config's (rul.config.recipes.train_command, with
    where its data, store and checkpoints are) and `--resume RUN_ID`."""
    try:
        command = train_command(config_from_params(run.data.params), places=True)
    except ConfigError:  # an earlier rul's keys
        command = "rul train CONFIG"
    return f"{command} --resume {run.info.run_id}"


class CannotResume(InputError):
    """`--resume` cannot continue the run it found (its checkpoint, or another process)."""


class RunCheckpoints:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.pt"

    def _lock_path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.lock"

    def has_checkpoint(self, run_id: str) -> bool:
        return Checkpointer(self.path(run_id)).exists()

    @contextmanager
    def held(self, run_id: str):
        """Hold the run's lock while training it; yields the run's Checkpointer. A run that
        ends without a checkpoint (stopped in its first epoch) leaves no lock file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self._lock_path(run_id), "a")  # noqa: SIM115 (held for the block)
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CannotResume(f"run {run_id} is being trained by another process") from None
            yield Checkpointer(self.path(run_id))
        finally:
            if not self.has_checkpoint(run_id):
                self._lock_path(run_id).unlink(missing_ok=True)
            handle.close()  # releases the lock

    def is_held(self, run_id: str) -> bool:
        if not self._lock_path(run_id).exists():
            return False
        try:
            with open(self._lock_path(run_id), "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True

    def close_abandoned(self, client: MlflowClient, experiment_id: str,
                        resuming: str | None = None) -> list[str]:
        """Mark KILLED, and return, the runs left RUNNING by a process that is gone (their lock
        here held by nobody, or without one their owner on this machine gone), their PENDING
        logged models FAILED, one line each; a run another process trains, or `resuming`, stays."""
        from mlflow.entities import LoggedModelStatus

        closed = []
        for run in client.search_runs([experiment_id],
                                      filter_string="attributes.status = 'RUNNING'"):
            rid = run.info.run_id
            alive = owner_alive(run.data.tags)
            if rid == resuming or alive or self.is_held(rid) or (
                    alive is None and not self._lock_path(rid).exists()):
                continue
            client.set_terminated(rid, status="KILLED")
            for model in client.search_logged_models(
                    [experiment_id], filter_string=f"source_run_id = '{rid}'"):
                if model.status == LoggedModelStatus.PENDING:
                    client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
            kept = self.has_checkpoint(rid)
            print(f"run {rid} was left RUNNING by a process that is gone: marked KILLED"
                  + (f" (continue it with: {resume_command(run)})"
                     if kept else ""), file=sys.stderr)
            if not kept:
                self._lock_path(rid).unlink(missing_ok=True)
            closed.append(rid)
        return closed

    def check_files(self, run_id: str | None = None) -> None:
        """FileNotFoundError when run `run_id` (None: any run) has no checkpoint here, read from
        the folder alone: said before any store is opened (or created)."""
        if run_id is not None and not self.has_checkpoint(run_id):
            raise FileNotFoundError(f"--resume {run_id}: no checkpoint at {self.path(run_id)}")
        if run_id is None and not any(self.directory.glob("*.pt*")):
            raise FileNotFoundError(self._nothing_to_resume())

    def _nothing_to_resume(self) -> str:
        return (f"nothing to resume: no unfinished run of this config has a checkpoint in "
                f"{self.directory} (run without --resume to start a new one)")

    def resumable_run(self, client: MlflowClient, experiment_id: str, digest: str,
                      run_id: str | None = None) -> str:
        """The run `--resume` continues (see the module docstring), its checkpoint verified;
        FileNotFoundError when there is none, CannotResume when it cannot be continued."""
        self.check_files(run_id)
        if run_id is not None:
            run = client.get_run(run_id)
            if run.info.status == "FINISHED":
                raise FileNotFoundError(f"--resume {run_id}: that run already FINISHED")
            if run.data.tags.get("rul.config_digest", digest) != digest:
                raise FileNotFoundError(
                    f"--resume {run_id}: that run trained another config (its "
                    "rul.config_digest differs: other keys or defaults); resume it with the "
                    "config and version it started with")
            if self.is_held(run_id):
                raise CannotResume(f"--resume {run_id}: that run is being trained by another "
                                   "process right now")
            return self._verified(client, run)
        runs = client.search_runs(
            [experiment_id], order_by=["attributes.start_time DESC"],
            filter_string=f"tags.`rul.config_digest` = '{digest}' "
                          "and attributes.status != 'FINISHED'")
        found = [run for run in runs
                 if self.has_checkpoint(run.info.run_id) and not self.is_held(run.info.run_id)]
        if len(found) > 1:
            raise CannotResume(f"--resume: {len(found)} unfinished runs of this config can be "
                               f"continued: {'; '.join(map(run_text, found))}; name one: "
                               "--resume RUN_ID")
        if found:
            return self._verified(client, found[0])
        raise FileNotFoundError(self._nothing_to_resume())

    @staticmethod
    def training_now(client: MlflowClient, experiment_id: str, digest: str) -> list:
        """The runs of the config (its digest) still RUNNING once the abandoned ones are
        closed: a live process trains them (or another machine's may), newest first."""
        return client.search_runs(
            [experiment_id], order_by=["attributes.start_time DESC"],
            filter_string=f"tags.`rul.config_digest` = '{digest}' "
                          "and attributes.status = 'RUNNING'")

    def _verified(self, client: MlflowClient, run) -> str:
        """`run`'s id once its newest intact checkpoint is in place (module docstring)."""
        rid = run.info.run_id
        path = self.path(rid)
        try:
            checkpoint.load(path)
            return rid
        except (CheckpointDamaged, FileNotFoundError) as error:
            found = (f"damaged ({error.reason})" if isinstance(error, CheckpointDamaged)
                     else "missing")
        try:
            earlier = checkpoint.load(checkpoint.previous(path))
        except (CheckpointDamaged, FileNotFoundError):
            self.remove(rid)
            client.set_tag(rid, CHECKPOINT_TAG, f"{found}, no earlier one intact: removed; the "
                                                "run cannot be resumed")
            if run.info.status == "RUNNING":  # its process was killed: nobody holds it
                client.set_terminated(rid, status="KILLED")
            raise CannotResume(
                f"--resume: run {rid} cannot be continued: its checkpoint {path} is {found} and "
                "no earlier one is intact (the files were removed); start the run over: the "
                "same command without --resume") from None
        os.replace(checkpoint.previous(path), path)
        epoch = earlier["train_state"]["epoch"]
        print(f"run {rid}: its newest checkpoint is {found}; resuming from the one before it, "
              f"after epoch {epoch}", file=sys.stderr)
        client.set_tag(rid, CHECKPOINT_TAG, f"the newest {found}: resumed from the one before "
                                            f"it (epoch {epoch})")
        return rid

    def remove(self, run_id: str) -> None:
        Checkpointer(self.path(run_id)).remove()
        self._lock_path(run_id).unlink(missing_ok=True)

"""Checkpoints belong to a run: `<checkpoint_dir>/<run_id>.pt`, locked while a process trains it.

Two runs of one config never share a file. `--resume` continues the newest unfinished run of
the config whose checkpoint exists and that no live process holds (the lock is an flock, so a
process killed even with SIGKILL releases it), or the run it is given.
"""

import fcntl
from contextlib import contextmanager
from pathlib import Path

from mlflow.tracking import MlflowClient

from rul.training.checkpoint import Checkpointer


class RunCheckpoints:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.pt"

    def _lock_path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.lock"

    @contextmanager
    def held(self, run_id: str):
        """Hold the run's lock while training it; yields the run's Checkpointer."""
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self._lock_path(run_id), "a")  # noqa: SIM115 (held for the block)
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"run {run_id} is being trained by another process") from None
            yield Checkpointer(self.path(run_id))
        finally:
            handle.close()  # releases the lock

    def is_held(self, run_id: str) -> bool:
        try:
            with open(self._lock_path(run_id), "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True

    def resumable_run(self, client: MlflowClient, experiment_id: str, digest: str,
                      run_id: str | None = None) -> str:
        """The run `--resume` continues (see the module docstring), or FileNotFoundError."""
        if run_id is not None:
            if not self.path(run_id).is_file():
                raise FileNotFoundError(f"--resume {run_id}: no checkpoint at {self.path(run_id)}")
            run = client.get_run(run_id)
            if run.info.status == "FINISHED":
                raise FileNotFoundError(f"--resume {run_id}: that run already FINISHED")
            if run.data.tags.get("rul.config_digest", digest) != digest:
                raise FileNotFoundError(
                    f"--resume {run_id}: that run trained another config (its "
                    "rul.config_digest differs: other keys or defaults); resume it with the "
                    "config and version it started with")
            return run_id
        runs = client.search_runs(
            [experiment_id], order_by=["attributes.start_time DESC"],
            filter_string=f"tags.`rul.config_digest` = '{digest}' "
                          "and attributes.status != 'FINISHED'")
        for run in runs:
            rid = run.info.run_id
            if self.path(rid).is_file() and not self.is_held(rid):
                return rid
        raise FileNotFoundError(
            f"nothing to resume: no unfinished run of this config has a checkpoint in "
            f"{self.directory} (run without --resume to start a new one)")

    def remove(self, run_id: str) -> None:
        self.path(run_id).unlink(missing_ok=True)
        self._lock_path(run_id).unlink(missing_ok=True)

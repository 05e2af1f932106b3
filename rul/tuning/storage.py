"""Where an Optuna study lives, and how workers on many machines share it safely.

- SQLite (`sqlite:///optuna.db`, the default for one worker): one process, no server.
- A JournalStorage file (`optuna.journal`, the default for --workers > 1): one machine.
- A database server URL (`postgresql://user@host/db`, MySQL): many machines. These get
  Optuna's heartbeat: a worker killed even with SIGKILL stops beating, and the next worker
  that asks for a trial (or waits at the end of its study) marks its trial FAIL and ends the
  trial's MLflow run KILLED.

`study_lock` serialises the few steps that must not race between `rul tune` processes that
start at once (creating the study's MLflow parent run): a PostgreSQL advisory lock on a
server, an flock beside a local file.
"""

import fcntl
import os
import warnings
import zlib
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient

from rul import services
from rul.tracking import study_runs
from rul.urls import remember, with_driver

DEFAULT_SQLITE = "sqlite:///optuna.db"
DEFAULT_JOURNAL = "optuna.journal"
DEAD_WORKER_REASON = "the worker running this trial died (no heartbeat)"


def resolve_url(url: str | None, workers: int) -> str:
    return url if url is not None else (DEFAULT_JOURNAL if workers > 1 else DEFAULT_SQLITE)


def is_journal(url: str) -> bool:
    return url.endswith(".journal") or url.startswith("journal:")


def is_server(url: str) -> bool:
    """A database server shared by many machines (not a local SQLite file or journal)."""
    return not is_journal(url) and not url.startswith("sqlite")


def check_url(url: str | None, workers: int) -> str:
    """The storage URL for `workers` (None: the default), or ConfigError when unusable."""
    from rul.config import ConfigError

    url = resolve_url(url, workers)
    if url.startswith("sqlite") and workers > 1:
        raise ConfigError(f"--storage {url}: SQLite storage is unsafe with --workers > 1: use "
                          "a .journal file (the default) or an RDB server URL")
    return url


def wait_for_server(url: str | None, workers: int) -> None:
    """A database server URL must answer before anything is done with it: retried for a
    bounded time with a countdown, then ServiceUnavailable (rul.services)."""
    url = resolve_url(url, workers)
    if is_server(url):
        services.wait_for_database(url, "--storage")


def open_storage(url: str | None, workers: int, heartbeat_interval: int | None = None,
                 grace_period: int | None = None, retry_dead_trials: int = 0):
    """The storage for `url` (None: the default for `workers`). With `heartbeat_interval`, a
    server URL opens an RDBStorage with Optuna's heartbeat; otherwise the URL is returned
    as is and Optuna opens it."""
    url = check_url(url, workers)
    remember(url)  # its secrets are masked in whatever this process prints (a worker too)
    if is_journal(url):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    if heartbeat_interval and is_server(url):
        on_stale = end_dead_trial_run
        if retry_dead_trials:
            on_stale = _retrying(retry_dead_trials)
        return optuna.storages.RDBStorage(
            with_driver(url), heartbeat_interval=heartbeat_interval, grace_period=grace_period,
            heartbeat_stale_trial_callback=on_stale,
            engine_kwargs={"pool_pre_ping": True})
    return with_driver(url)


def has_heartbeat(storage) -> bool:
    from optuna.storages._heartbeat import is_heartbeat_enabled  # public: fail_stale_trials

    return not isinstance(storage, str) and is_heartbeat_enabled(storage)


def end_dead_trial_run(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Optuna's stale-trial callback: the trial is already FAIL; end its MLflow run KILLED
    (run by a surviving worker, whose MLflow tracking URI is configured)."""
    study_runs.end_failed_trial_runs(MlflowClient(), trial.user_attrs, DEAD_WORKER_REASON)


def _retrying(max_retry: int):
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)

    def on_stale(study, trial):
        end_dead_trial_run(study, trial)
        retry(study, trial)

    return on_stale


def retried_trial_numbers(trials) -> set[int]:
    """Numbers of FAIL trials that a retry replaced (they do not count towards n_trials)."""
    history = optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history
    with warnings.catch_warnings():  # Optuna marks it experimental: rul relies on it knowingly
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return {number for trial in trials for number in history(trial)}


def study_lock(url: str | None, workers: int, study_name: str):
    """A lock held by one `rul tune` process at a time for `study_name` on this storage."""
    url = resolve_url(url, workers)
    if url.startswith("postgresql"):
        return _advisory_lock(url, study_name)
    path = url.removeprefix("journal:") if is_journal(url) else url.removeprefix("sqlite:///")
    if is_journal(url) or (url.startswith("sqlite:///") and path != ":memory:"):
        return _file_lock(Path(f"{path}.{study_name}.lock"))
    return nullcontext()  # in-memory SQLite: one process; other servers: best effort


@contextmanager
def _file_lock(path: Path):
    """An flock on `path`, the file removed by its holder on the way out (a study stopped by
    Ctrl-C too), so that no lock file stays beside the study. A process that waited on the
    file its holder removed locks the new one instead (the inode checked after each lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = open(path, "a")  # noqa: SIM115 (held across the yield, closed below)
        fcntl.flock(handle, fcntl.LOCK_EX)  # released on close, also when killed
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()  # the file was removed while this process waited: lock the new one
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            path.unlink()  # still held: no other process holds a lock on this file
        handle.close()


@contextmanager
def _advisory_lock(url: str, study_name: str):
    import sqlalchemy

    key = zlib.crc32(f"rul-tune:{study_name}".encode())
    engine = sqlalchemy.create_engine(with_driver(url), poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:  # the lock dies with the connection
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"),
                                   {"key": key})
    finally:
        engine.dispose()

"""Which MLflow store to use, and the experiment for a subset.

A command opens its store once (`open_store`: the store made ready, and the experiment its
runs go in) and hands it down. A store is made ready once per process before its first use
(`configure`): a tracking server must answer (rul.services waits for it, bounded), and a new
SQLite store's tables are created by one process at a time (MLflow migrates an empty database
on first use; two processes doing it at once fail), under an flock on the database's folder.
"""

import fcntl
import os
import sys
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from rul import services
from rul.config import ConfigError
from rul.console import quiet
from rul.tracking_uri import (  # noqa: F401 (their home)
    DEFAULT_URI,
    for_mlflow,
    sqlite_path,
    store_uri,
)
from rul.urls import remember

# MLflow 3's UI opens an experiment in its GenAI (traces) view unless told otherwise; this tag,
# MLflow's own, makes it open on the runs table and model metrics.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
DATABASES = ("postgresql", "mysql", "mssql", "oracle")

_ready: set[str] = set()  # stores made ready in this process
DAMAGED = ("database disk image is malformed", "file is not a database")  # SQLite's words


def configure(tracking_uri: str | None = None) -> str:
    """Use the store `store_uri` names; it is made ready on first use (module docstring)."""
    uri = store_uri(tracking_uri)
    # MLflow draws a progress bar for every tiny artifact it reads back; ours is the epoch bar.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    remember(uri)  # its secrets are masked in whatever the command prints
    mlflow.set_tracking_uri(for_mlflow(uri))
    os.environ["MLFLOW_TRACKING_URI"] = uri  # what subprocesses inherit: the URI as given
    _make_ready(uri)
    return uri


def _make_ready(uri: str) -> None:
    database = sqlite_path(uri)
    key = str(database.resolve()) if database else uri
    if key in _ready:
        return
    if uri.startswith(("http://", "https://")):
        services.wait_for_http(uri, "MLflow tracking server")
    elif uri.split(":")[0].split("+")[0] in DATABASES:
        services.wait_for_database(uri, "MLflow tracking store")
    if database is not None:
        _check_writable(database)
        with _first_use_lock(database), quiet("mlflow.store.db.utils", "alembic"):
            if not database.exists():
                print(f"a new MLflow store: {uri}", file=sys.stderr)
            try:
                # creates or checks the tables
                MlflowClient(for_mlflow(uri)).search_experiments(max_results=1)
            except Exception as error:  # noqa: BLE001 (SQLAlchemy's, often inside MLflow's)
                said = next((s for s in DAMAGED if s in str(error)), None)
                if said is None:
                    raise
                raise ConfigError(f"tracking store {database}: the file is damaged (SQLite: "
                                  f"{said}); restore it from a backup, or move it away to "
                                  "start a new store") from None
    _ready.add(key)


def _check_writable(database: Path) -> None:
    """A SQLite store this user cannot write (the file, or the folder its journal goes in)
    is one line before anything starts."""
    folder = database.absolute().parent
    read_only = [path for path in (database, folder)
                 if path.exists() and not os.access(path, os.W_OK)]
    if read_only:
        what = read_only[0]
        raise ConfigError(f"tracking store {database}: {what} is read-only for this user; "
                          "make it writable, or track to another store (tracking_uri=...)")


@contextmanager
def _first_use_lock(database: Path):
    """An flock on the database's folder (created if needed, as MLflow would): no file of its
    own, released when the process ends however it ends. Where the folder cannot be locked
    (no such folder can be made, a filesystem without flock) MLflow goes on alone and says
    what is wrong itself."""
    folder = database.absolute().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def ensure_experiment(name: str) -> str:
    """Create the experiment if needed (once, before any parallel workers) and return its id.

    The experiment is tagged as model development, also one made before this tag existed or
    one the UI only guessed a kind for (`*_inferred`); a kind someone chose is kept."""
    client = MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except mlflow.exceptions.MlflowException:  # created meanwhile by another process
            experiment = client.get_experiment_by_name(name)
    kind = experiment.tags.get(EXPERIMENT_KIND_TAG)
    if kind is None or kind.endswith("_inferred"):
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


@dataclass(frozen=True)
class Store:
    """A command's store, ready (the process and its workers use it), and the experiment
    its runs go in."""

    experiment_id: str


def open_store(config) -> Store:
    """Use the store of `config` (its tracking_uri) and its experiment (created if needed):
    once per command, before any run or worker process."""
    configure(config.tracking_uri)
    return Store(ensure_experiment(config.experiment_name))

"""Which MLflow store to use, and the experiment for a subset.

A command opens its store once (`open_store`) and hands it down. `configure` makes a store
ready once per process: a tracking server must answer (rul.services waits, bounded), and a new
SQLite store is created under an flock on its folder (two processes migrating one database at
once fail), built aside (`.<name>.building-*`) and renamed into place once complete; one left
half-built by an earlier rul (no runs, no registered model) is built anew (docs: When things
go wrong). Every new store runs MLflow's own migrations: a copy of a kept empty store saved a
few seconds once per store, but no check could prove a kept file holds only MLflow's schema.
"""

import contextlib
import fcntl
import itertools
import os
import sqlite3
import sys
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from rul import services
from rul.config import ConfigError
from rul.console import quiet
from rul.files import sync_folder
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

_ready: set[tuple[str, bool]] = set()  # (store, for writes) made ready in this process
DAMAGED = ("database disk image is malformed", "file is not a database")  # SQLite's words


def configure(tracking_uri: str | None = None, writes: bool = True) -> str:
    """Use the store `store_uri` names; it is made ready on first use (module docstring).
    `writes=False`: the command only reads (`rul predict`), so a store this user cannot
    write is used as it is."""
    uri = store_uri(tracking_uri)
    # MLflow draws a progress bar for every tiny artifact it reads back; ours is the epoch bar.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    remember(uri)  # its secrets are masked in whatever the command prints
    mlflow.set_tracking_uri(for_mlflow(uri))
    os.environ["MLFLOW_TRACKING_URI"] = uri  # what subprocesses inherit: the URI as given
    _make_ready(uri, writes)
    return uri


def _make_ready(uri: str, writes: bool = True) -> None:
    database = sqlite_path(uri)
    key = (str(database.resolve()) if database else uri, writes)
    if key in _ready or (key[0], True) in _ready:
        return
    if uri.startswith(("http://", "https://")):
        services.wait_for_http(uri, "MLflow tracking server")
    elif uri.split(":")[0].split("+")[0] in DATABASES:
        services.wait_for_database(uri, "MLflow tracking store")
    if database is not None:
        if not writes and not database.exists():
            return  # nothing to read there (a model folder needs no store): none is made
        if writes:
            _check_writable(database)
        with _first_use_lock(database), quiet("mlflow.store.db.utils", "alembic"):
            if not database.exists() or database.stat().st_size == 0:  # 0: killed at once
                print(f"a new MLflow store: {uri}", file=sys.stderr)
                _build_aside(database)
            try:
                _open(database, uri)
            except Exception as error:  # noqa: BLE001 (SQLAlchemy's, often inside MLflow's)
                if not _schema_error(error):
                    raise
                if not _half_built(database):
                    raise ConfigError(f"tracking store {database}: MLflow cannot open it ("
                                      f"{_first_sentence(error)})") from None
                print(f"tracking store {database} was left half-built by an interrupted "
                      "creation (it holds no run): built anew", file=sys.stderr)
                _release(for_mlflow(uri))  # connections to the file about to be replaced
                _build_aside(database)
                _open(database, uri)
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
    """An flock on the database's folder (created if needed), released when the process ends
    however it ends; where it cannot be locked, MLflow goes on alone and says what is wrong."""
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
    """Create the experiment if needed (once, before any parallel workers) and return its id,
    tagged as model development unless someone chose a kind (not `*_inferred`)."""
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


def open_store(config, close_abandoned: bool = True) -> Store:
    """Use the store of `config` (its tracking_uri) and its experiment (created if needed), once
    per command before any run or worker; runs left RUNNING by a process that is gone are
    marked KILLED first unless `close_abandoned` is False (`--resume` closes them itself)."""
    from rul.tracking.run_checkpoints import RunCheckpoints

    configure(config.tracking_uri)
    store = Store(ensure_experiment(config.experiment_name))
    if close_abandoned:
        RunCheckpoints(config.checkpoint_dir).close_abandoned(MlflowClient(),
                                                              store.experiment_id)
    return store


def _open(database: Path, uri: str) -> None:
    """Open the SQLite store at `database` (`uri`) as MLflow does (it checks the tables);
    ConfigError for a damaged file."""
    try:
        MlflowClient(for_mlflow(uri)).search_experiments(max_results=1)
    except Exception as error:  # noqa: BLE001 (SQLAlchemy's, often inside MLflow's)
        said = next((s for s in DAMAGED if s in str(error)), None)
        if said is None:
            raise
        raise ConfigError(f"tracking store {database}: the file is damaged (SQLite: "
                          f"{said}); restore it from a backup, or move it away to "
                          "start a new store") from None


def building(database: Path) -> Path:
    """Where a new store at `database` is built before it is renamed into place: a name per
    attempt (MLflow keeps a store per URI), removed by the next if this one was killed."""
    folder = database.absolute().parent
    for leftover in folder.glob(f".{database.name}.building-*"):  # under the first-use lock
        leftover.unlink(missing_ok=True)
    return folder / f".{database.name}.building-{os.getpid()}-{next(_attempts)}"


_attempts = itertools.count()


def _build_aside(database: Path) -> None:
    """A complete new store at `database`, built by MLflow in `building(database)`, synced and
    renamed into place; a failure leaves what was there."""
    aside = building(database)
    _opened_or_removed(aside)  # MLflow creates every table
    try:
        with open(aside, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(aside, database.absolute())
        sync_folder(database.absolute().parent)
    except BaseException:
        _remove(aside)
        raise


def _opened_or_removed(aside: Path) -> None:
    """MLflow opens the store at `aside` (creating its tables if it has none), then lets go
    of it; on any failure the file is removed and the error raised."""
    uri = f"sqlite:///{aside}"
    try:
        MlflowClient(uri).search_experiments(max_results=1)
        _release(uri)
    except BaseException:
        _remove(aside)
        raise


def _remove(aside: Path) -> None:
    _release(f"sqlite:///{aside}")
    for suffix in ("", "-journal", "-wal", "-shm"):
        aside.with_name(aside.name + suffix).unlink(missing_ok=True)


def _release(uri: str) -> None:
    """Close MLflow's pooled connections to the store at `uri` (its engines are kept per URI
    for the process), so that nothing holds the file built aside once it is renamed."""
    from mlflow.store.model_registry.sqlalchemy_store import (
        SqlAlchemyStore as RegistryStore,
    )
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for kind in (SqlAlchemyStore, RegistryStore):
        engine = getattr(kind, "_engine_map", {}).pop(uri, None)
        if engine is not None:
            engine.dispose()


SCHEMA_ERRORS = ("already exists", "no such table", "out-of-date database schema")


def _schema_error(error: Exception) -> bool:
    """A table there already, one missing, MLflow's out-of-date schema: what a store whose
    creation was interrupted answers (and an older MLflow's store)."""
    return any(words in str(error) for words in SCHEMA_ERRORS)


def _first_sentence(error: Exception) -> str:
    return str(error).strip().split("\n")[0].split(". ")[0][:200]


def _half_built(database: Path) -> bool:
    """Whether a store that answered a schema error holds nothing: no run and no registered
    model (its creation was interrupted; an older MLflow's store with runs is kept)."""
    try:
        read_only = f"{database.absolute().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(read_only, uri=True)) as db:
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            return all(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0
                       for table in ("runs", "registered_models") if table in tables)
    except sqlite3.Error:
        return False

"""A new SQLite store used by several processes at once: MLflow creates its tables on first use,
and processes doing that together used to fail (`duplicate column name`, alembic's "expected
to match one row"). rul.tracking.store makes one process at a time do it, builds the store
aside so that a kill while its tables are created leaves nothing half-built, and rebuilds a
half-built store an earlier rul left."""

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import unwarned
from mlflow.tracking import MlflowClient

from rul.files import USER_CACHE_ENV

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
    assert unwarned(result.output) == [
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


def schema_version(database: Path) -> str | None:
    """The schema version a SQLite store records (None: no record); a new store's first."""
    import sqlite3

    if not database.exists():
        MlflowClient(f"sqlite:///{database}").search_experiments()
    with contextlib.closing(sqlite3.connect(database)) as db:
        try:
            return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        except (sqlite3.Error, TypeError):
            return None


KILLED_WHILE_CREATING = """
import sys
from rul.tracking import store
print("ready", flush=True)
store.configure(sys.argv[1])
"""


@pytest.mark.slow
def test_a_store_killed_while_it_is_created_is_never_left_half_built(write_cmapss, tmp_path):
    """SIGKILL at moments spread over the creation of a new store's tables (dozens of
    migrations, seconds): after each, the store is absent or complete, and the next command
    trains on it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    work = tmp_path / "work"
    work.mkdir()
    complete = schema_version(tmp_path / "reference.db")
    seen = set()
    for delay in (0.0, 0.1, 0.3, 0.6, 1.0, 1.6):  # after the tables began (a busy machine
        process = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_CREATING,  # takes
                                    "sqlite:///mlflow.db"], cwd=work, env=env,  # seconds to
                                   stdout=subprocess.PIPE, text=True)  # import what it needs)
        assert process.stdout.readline().strip() == "ready"
        began = time.monotonic() + 120
        while not list(work.iterdir()) and process.poll() is None \
                and time.monotonic() < began:  # until the store's first file appears
            time.sleep(0.01)
        time.sleep(delay)
        process.kill()
        process.wait()
        process.stdout.close()
        store = work / "mlflow.db"
        if store.exists():  # complete, whenever the kill came
            assert schema_version(store) == complete
        seen.add(store.exists())
        for path in work.iterdir():  # the next attempt starts from nothing
            path.unlink()
    assert False in seen  # some kills did land while the tables were created
    data_dir = write_cmapss(train_lengths=(52, 60, 35, 47, 41, 55, 49, 58, 44, 50))
    [done] = run_together([[sys.executable, "-m", "rul", "train", *TINY,
                            f"data_dir={data_dir}", "--no-progress"]], work)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in work.iterdir() if p.name != "ckpt") == ["mlflow.db", "mlruns"]


def test_a_half_built_store_of_an_earlier_rul_is_built_anew_and_one_with_runs_is_kept(
        tmp_path, monkeypatch, capsys):
    """A store whose creation an earlier rul's kill interrupted: tables there, its schema's
    version short of MLflow's (`table ... already exists` on every later command). Holding no
    run, it is built anew in one line; holding runs, it is never touched: one line."""
    import sqlite3

    from rul.errors import ConfigError
    from rul.tracking import store

    monkeypatch.chdir(tmp_path)
    half = tmp_path / "half.db"

    def spelled(n: int) -> str:  # the file under a name of its own: MLflow keeps a store
        (tmp_path / f"as{n}").symlink_to(tmp_path)  # per URI for the process, checked once
        return f"sqlite:///{tmp_path / f'as{n}' / 'half.db'}"

    MlflowClient(spelled(0)).search_experiments()
    with sqlite3.connect(half) as db:  # the migrations' record gone: they would run again
        db.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
    capsys.readouterr()
    store.configure(spelled(1))
    assert capsys.readouterr().err == (f"tracking store {tmp_path / 'as1' / 'half.db'} was left "
                                       "half-built by an interrupted creation (it holds no run): "
                                       "built anew\n")
    client = MlflowClient(spelled(2))
    run = client.create_run(client.create_experiment("e"))
    assert [p.name for p in tmp_path.iterdir() if "building" in p.name] == []

    with sqlite3.connect(half) as db:
        db.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
    store._ready.clear()  # a new process would check it again
    with pytest.raises(ConfigError) as refused:
        store.configure(spelled(3))
    assert "\n" not in str(refused.value) and "as3/half.db" in str(refused.value)
    with sqlite3.connect(half) as db:  # kept as it was
        assert db.execute("SELECT run_uuid FROM runs").fetchall() == [(run.info.run_id,)]


def _tables(db) -> list:
    """A SQLite database's tables and indexes, each definition's lines sorted (MLflow's own
    migrations write a table's constraints in an order that varies from build to build)."""
    return sorted((kind, name, table, sorted(line.strip().rstrip(",")
                                             for line in (sql or "").splitlines()))
                  for kind, name, table, sql in db.execute(
                      "SELECT type, name, tbl_name, sql FROM sqlite_master"))


def _new_store(folder: Path, monkeypatch) -> tuple[list, list]:
    """A new default store made by rul in `folder` with one experiment: its tables and its
    experiments (id, name, artifact location)."""
    import sqlite3

    from rul.tracking import store

    folder.mkdir()
    monkeypatch.chdir(folder)
    store.configure("sqlite:///mlflow.db")
    store.ensure_experiment("e")
    with contextlib.closing(sqlite3.connect(folder / "mlflow.db")) as db:
        return (_tables(db),
                db.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage "
                           "FROM experiments ORDER BY experiment_id").fetchall())


@pytest.fixture
def migrations(tmp_path, monkeypatch) -> list:
    """Each time MLflow creates a store's tables (its migrations), with a user cache of the
    test's own and the default store."""
    import mlflow.store.db.utils as db_utils

    monkeypatch.setenv(USER_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    done, initialize = [], db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables",
                        lambda engine: (done.append(engine.url), initialize(engine)))
    return done


def test_a_new_store_is_mlflow_s_own_never_a_file_of_the_user_cache(tmp_path, monkeypatch,
                                                                      migrations):
    """A store planted where rul once kept an empty store to copy (a trigger added, which would
    run on the new store's writes) is never read: every new store runs MLflow's migrations and
    holds only what they create."""
    import mlflow

    tables, _ = _new_store(tmp_path / "first", monkeypatch)
    assert len(migrations) == 1
    forged = tmp_path / "cache" / "mlflow-stores" / f"mlflow-{mlflow.__version__}.db"
    forged.parent.mkdir(parents=True, exist_ok=True)  # where an earlier rul kept its own
    forged.unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(forged)) as db:
        with contextlib.closing(sqlite3.connect(tmp_path / "first" / "mlflow.db")) as built:
            built.backup(db)
        db.execute("DELETE FROM experiments")
        db.execute("CREATE TRIGGER forged AFTER INSERT ON model_versions BEGIN UPDATE "
                   "model_versions SET storage_location = '/elsewhere'; END")
        db.commit()
    copied, experiments = _new_store(tmp_path / "second", monkeypatch)
    assert len(migrations) == 2 and copied == tables
    assert "forged" not in {name for _, name, *_ in copied}
    assert [n for _, n, *_ in experiments] == ["Default", "e"]

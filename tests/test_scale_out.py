"""Scaling out: one study shared by several `rul tune` processes through PostgreSQL, tracked by
an `mlflow server` over HTTP, and a registered model loaded from elsewhere over HTTP alone.

A throwaway PostgreSQL cluster (Debian's postgresql server binaries, initdb into a temporary
folder, run as the postgres user when we are root) and an `mlflow server` (the command of
`make server`) are started once for the module and stopped afterwards. Tests that need
PostgreSQL skip without its binaries or driver, but fail on CI (CI=true), which installs them.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import optuna
import pandas as pd
import pytest
from conftest import postgres_cluster, unavailable
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from rul.tuning.storage import DEAD_WORKER_REASON, study_lock, with_driver

ROOT = Path(__file__).resolve().parents[1]
TUNE_PATH = ROOT / "experiments" / "tune_fd001.yaml"
MODEL_NAME = "rul-fd001"
TINY = {"epochs": 2, "patience": 5, "filters": 4, "num_layers": 2, "hidden_size": 16,
        "micro_batch_size": 1024, "accumulation_steps": 1, "max_effective_batch": "null"}
SPACE = '{lr: {type: float, low: 0.0001, high: 0.003, log: true}}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="module")
def postgres_url():
    """postgresql://postgres@127.0.0.1:PORT/rul_test on a throwaway cluster (conftest)."""
    with postgres_cluster("rul_test", "rul_server") as url:
        yield url


# ---------------------------------------------------------------- MLflow tracking server


def server_command(port: int, root: Path, backend: str | None = None) -> list[str]:
    """The command `make server` runs (read from the Makefile, so the two cannot drift)."""
    venv = Path(sys.executable).parent.parent
    backend = backend or f"sqlite:///{root}/mlflow-server.db"
    printed = subprocess.run(
        ["make", "-s", "-n", "-C", str(ROOT), "-o", f"{venv}/.installed", "server",
         f"VENV={venv}", f"PORT={port}", f"SERVER_BACKEND={backend}",
         f"SERVER_ARTIFACTS={root}/mlartifacts", "SERVER_ARGS=--workers 1"],
        check=True, capture_output=True, text=True).stdout
    return [part.strip("'") for part in printed.replace("\\\n", " ").split()]


@contextlib.contextmanager
def running_server(root: Path, backend: str | None = None):
    """`make server` on 127.0.0.1 (a SQLite backend unless `backend`), served artifacts."""
    if shutil.which("make") is None:
        unavailable("make is not installed")
    port = free_port()
    command = server_command(port, root, backend)
    assert command[1:5] == ["-m", "rul.tracking.ui", "server", "--backend-store-uri"]
    assert "--serve-artifacts" in command
    assert command[command.index("--host") + 1] == "127.0.0.1"  # the default binding
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed in finally)
    process = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if process.poll() is not None:
                pytest.fail(f"mlflow server exited: {(root / 'server.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not answer /health within 120 s")
        yield SimpleNamespace(url=url, root=root, log=root / "server.log")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """An `mlflow server` on 127.0.0.1 with a SQLite backend and served artifacts."""
    with running_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.mark.slow
def test_make_server_takes_a_postgresql_backend_and_shows_no_password(postgres_url, tmp_path):
    """`SERVER_BACKEND=postgresql://user:password@...`: the driver rul installs (MLflow alone
    asks for psycopg 3), and the password nowhere in what the server prints."""
    secret = "Srv-S3cret-91"
    backend = postgres_url.replace("postgres@", f"postgres:{secret}@").replace("rul_test",
                                                                              "rul_server")
    with running_server(tmp_path, backend) as server:
        client = MlflowClient(server.url)
        assert client.search_experiments()[0].name == "Default"  # tables made in PostgreSQL
    assert secret not in server.log.read_text()


# ---------------------------------------------------------------- `rul tune` processes


def tune_command(study_name: str, storage: str, n_trials: int, root: Path, data_dir: Path,
                 *extra: str) -> list[str]:
    keys = {**TINY, "data_dir": data_dir, "checkpoint_dir": root / "ckpt",
            "baseline_trial": "false", "promote": "true"}  # its best becomes the champion
    return [sys.executable, "-m", "rul", "tune", str(TUNE_PATH),
            *(f"{k}={v}" for k, v in keys.items()), f"search_space={SPACE}", *extra,
            "--n-trials", str(n_trials), "--storage", storage, "--study-name", study_name]


def start_tune(command: list[str], tracking_uri: str, cwd: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=open(log, "w"),  # noqa: SIM115
                            stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path, timeout: float = 400) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"`rul tune` did not finish in {timeout} s:\n{log.read_text()[-3000:]}")


def runs_of_study(client: MlflowClient, study_name: str) -> list:
    experiment = client.get_experiment_by_name(MODEL_NAME)
    return client.search_runs([experiment.experiment_id], max_results=1000,
                              filter_string=f"tags.`optuna.study` = '{study_name}'")


# ---------------------------------------------------------------- two processes, one study


@pytest.fixture(scope="module")
def shared_study(postgres_url, mlflow_server, real_data_dir, tmp_path_factory):
    """Two `rul tune` processes started at once on one PostgreSQL study, 4 trials in total,
    tracked by the MLflow server; the best trial is registered as champion."""
    root = tmp_path_factory.mktemp("shared-study")
    name = "scale-out-shared"
    processes = []
    for i in range(2):
        cwd = root / f"machine-{i}"
        cwd.mkdir()
        command = tune_command(name, postgres_url, 4, cwd, real_data_dir)
        processes.append((start_tune(command, mlflow_server.url, cwd, cwd / "tune.log"),
                          cwd / "tune.log"))
    codes = [finish(p, log) for p, log in processes]
    logs = [log.read_text() for _, log in processes]
    study = optuna.load_study(study_name=name, storage=with_driver(postgres_url))
    client = MlflowClient(tracking_uri=mlflow_server.url)
    return SimpleNamespace(name=name, codes=codes, logs=logs, study=study, client=client,
                           trials=study.get_trials(deepcopy=True),
                           runs=runs_of_study(client, name))


@pytest.mark.slow
def test_two_processes_share_one_study_with_unique_trials(shared_study):
    assert shared_study.codes == [0, 0], "\n".join(shared_study.logs)
    trials = shared_study.trials
    assert sorted(t.number for t in trials) == [0, 1, 2, 3]  # unique, and 4 in total
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert sum(t.state == TrialState.COMPLETE for t in trials) >= 2  # pruning from trial 3
    # Both processes worked on the study (each one ran at least one trial).
    assert all("study scale-out-shared: 4 trials" in log for log in shared_study.logs)


@pytest.mark.slow
def test_every_trial_run_is_a_child_of_the_one_parent_run(shared_study):
    parent_id = shared_study.study.user_attrs["mlflow_parent_run_id"]
    runs = shared_study.runs
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.run_id for r in parents] == [parent_id]  # no second parent from the race
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert sorted(int(r.data.tags["optuna.trial"]) for r in children) == [0, 1, 2, 3]
    by_trial = {t.number: t.user_attrs["mlflow_run_id"] for t in shared_study.trials}
    assert {int(r.data.tags["optuna.trial"]): r.info.run_id for r in children} == by_trial
    assert len(runs) == 5
    assert {r.info.status for r in runs} == {"FINISHED"}  # nothing left RUNNING
    # The trials' artifacts went to the server, not to a folder of the worker.
    assert all(r.info.artifact_uri.startswith("mlflow-artifacts:/") for r in runs)


@pytest.mark.slow
def test_champion_loads_elsewhere_over_http_alone(shared_study, mlflow_server, fd001,
                                                  tmp_path):
    import mlflow

    client = shared_study.client
    best = shared_study.study.best_trial
    version = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert version.run_id == best.user_attrs["mlflow_run_id"]
    download = client.get_model_version_download_uri(MODEL_NAME, version.version)
    assert download.startswith("mlflow-artifacts:/"), download  # served, not a local path

    rows = fd001.test[fd001.test["unit"] <= 5]
    rows.to_csv(tmp_path / "rows.csv", index=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = ("import mlflow, pandas as pd\n"
              "model = mlflow.pyfunc.load_model('models:/rul-fd001@champion')\n"
              "model.predict(pd.read_csv('../rows.csv')).to_csv('out.csv', index=False)\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(elsewhere), "PYTHONPATH": str(ROOT),
           "MLFLOW_TRACKING_URI": mlflow_server.url}
    done = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    remote = pd.read_csv(elsewhere / "out.csv")

    mlflow.set_tracking_uri(mlflow_server.url)
    try:
        local = mlflow.pyfunc.load_model(f"runs:/{version.run_id}/model").predict(rows)
    finally:
        mlflow.set_tracking_uri(None)
    assert list(remote["unit"]) == [1, 2, 3, 4, 5]
    assert remote["rul"].tolist() == pytest.approx(local["rul"].tolist(), abs=1e-4)
    assert remote["rul"].between(0, 200).all()


# ---------------------------------------------------------------- a worker killed with SIGKILL


def wait_for(condition, timeout: float, what: str, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(step)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.slow
def test_a_killed_worker_is_failed_by_the_heartbeat_and_its_trial_retried(
        postgres_url, mlflow_server, real_data_dir, tmp_path):
    name, n_trials = "scale-out-sigkill", 3
    heartbeat = ["heartbeat_interval=1", "heartbeat_grace_period=5", "retry_dead_trials=1",
                 "epochs=4", "pruner=none"]
    processes = []
    for i in range(2):
        cwd = tmp_path / f"machine-{i}"
        cwd.mkdir()
        command = tune_command(name, postgres_url, n_trials, cwd, real_data_dir, *heartbeat)
        processes.append((start_tune(command, mlflow_server.url, cwd, cwd / "tune.log"),
                          cwd / "tune.log"))

    def both_in_a_trial() -> bool:
        with contextlib.suppress(KeyError):  # the study is not created yet
            study = optuna.load_study(study_name=name, storage=with_driver(postgres_url))
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            return len(running) == 2 and all("mlflow_run_id" in t.user_attrs for t in running)
        return False

    wait_for(both_in_a_trial, 300, "both workers to be in a trial")
    victim, victim_log = processes[0]
    victim.send_signal(signal.SIGKILL)  # no clean-up at all: only the heartbeat can tell
    victim.wait()
    survivor, survivor_log = processes[1]
    assert finish(survivor, survivor_log) == 0, survivor_log.read_text()[-3000:]

    study = optuna.load_study(study_name=name, storage=with_driver(postgres_url))
    trials = study.get_trials(deepcopy=True)
    assert not [t.number for t in trials if t.state in (TrialState.RUNNING,
                                                         TrialState.WAITING)]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1  # the dead worker's trial
    assert sum(t.state == TrialState.COMPLETE for t in trials) == n_trials  # still n_trials
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number
    assert [retry(t) for t in trials if retry(t) is not None] == [failed[0].number]

    client = MlflowClient(tracking_uri=mlflow_server.url)
    dead_run = client.get_run(failed[0].user_attrs["mlflow_run_id"])
    assert dead_run.info.status == "KILLED"
    assert dead_run.data.tags["optuna.reason"] == DEAD_WORKER_REASON
    runs = runs_of_study(client, name)
    assert len(runs) == 1 + len(trials)
    assert "RUNNING" not in {r.info.status for r in runs}
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"


# ---------------------------------------------------------------- the study lock


def test_study_lock_is_exclusive_across_processes(postgres_url, tmp_path):
    """While this process holds the advisory lock, another process cannot take it."""
    probe = ("import sys, zlib, psycopg2\n"
             "cursor = psycopg2.connect(sys.argv[1]).cursor()\n"
             "cursor.execute('SELECT pg_try_advisory_lock(%s)',"
             " (zlib.crc32(b'rul-tune:locked-study'),))\n"
             "print(cursor.fetchone()[0])\n")

    def other_process_gets_it() -> str:
        return subprocess.run([sys.executable, "-c", probe, postgres_url], check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()

    with study_lock(postgres_url, 1, "locked-study"):
        assert other_process_gets_it() == "False"
    assert other_process_gets_it() == "True"


def test_file_study_lock_is_exclusive_across_processes(tmp_path):
    journal = str(tmp_path / "optuna.journal")
    probe = ("import fcntl, sys\n"
             "h = open(sys.argv[1], 'a')\n"
             "try:\n    fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB); print(True)\n"
             "except BlockingIOError:\n    print(False)\n")
    lock_file = f"{journal}.s.lock"

    def other_process_gets_it() -> str:
        return subprocess.run([sys.executable, "-c", probe, lock_file], check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()

    with study_lock(journal, 2, "s"):
        assert other_process_gets_it() == "False"
    assert other_process_gets_it() == "True"


@pytest.mark.slow
def test_a_database_server_that_refuses_is_a_bad_url_said_at_once(postgres_url, tmp_path,
                                                                   monkeypatch):
    """It answered: no waiting (rul.services retries servers that do not answer)."""
    from click.testing import CliRunner

    from rul.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUL_CONNECT_TIMEOUT", "60")
    wrong = postgres_url.rsplit("/", 1)[0] + "/no_such_db"
    started = time.monotonic()
    result = CliRunner().invoke(main, ["tune", str(TUNE_PATH), "--storage", wrong])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: --storage {wrong}: connection to server at ")
    assert result.stderr.endswith('database "no_such_db" does not exist\n')
    assert result.stderr.count("\n") == 1 and time.monotonic() - started < 30
    assert list(tmp_path.iterdir()) == []

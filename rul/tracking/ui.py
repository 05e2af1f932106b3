"""`make ui` and `make server`: MLflow's UI or tracking server, its backend store's URL under
rul's driver rule, stopped with every process it started.

A database backend that refuses (a wrong password) is one line before anything starts. It
serves rul's app (rul.tracking.ui_app) unless ARGS name another `--app-name`; `ui` runs one web
worker without access log and prints each experiment's page once it answers. Neither starts
MLflow's job consumers (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true does) or sends usage data.
`mlflow ui` forwards a signal to its web server only, so this runs it in its own session and
ends the whole tree (stop_tree) when it ends or this process is interrupted, terminated or
hung up on. Ctrl-C is the UI's normal end: exit 0.

    python -m rul.tracking.ui --backend-store-uri sqlite:///mlflow.db --port 5000
    python -m rul.tracking.ui server --backend-store-uri postgresql://... --port 5000
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psutil

from rul.urls import with_driver

GRACE_S = 4.0  # Ctrl-C ends the UI within about this: nothing of it needs longer


def stop_tree(pid: int, grace: float = GRACE_S) -> list[int]:
    """End `pid` (suspended, its tree listed, then killed) and its descendants (SIGTERM, then
    SIGKILL after `grace` seconds); return the pids that had to be killed."""
    try:
        root = psutil.Process(pid)
        root.suspend()
        tree = root.children(recursive=True)
        root.kill()
    except psutil.NoSuchProcess:
        return []
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in alive]


APP = "rul"  # rul.tracking.ui_app, as pyproject.toml registers it for MLflow
# What `make ui` and `make server` set unless the environment says otherwise.
ENVIRONMENT = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
UI_WORKERS = "1"
SERVER_OPTIONS = ("--uvicorn-opts", "--gunicorn-opts", "--waitress-opts")
READY_S = 300  # how long to wait for the UI's first answer before printing its pages
PAGES_SHOWN = 5  # experiments whose page is printed, the newest first


def experiment_page(experiment_id: str) -> str:
    """The UI's page of an experiment's runs, in the Model training view (the URL's
    `workflowType` wins over what a browser chose)."""
    return f"/#/experiments/{experiment_id}?workflowType=machine_learning"


BACKEND = "--backend-store-uri"
DATABASES = ("postgresql", "mysql", "mssql", "oracle")


def with_backend_driver(argv: list[str]) -> list[str]:
    """`argv` with its backend store's URL under the driver rule (either spelling)."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == BACKEND and i + 1 < len(out):
            out[i + 1] = with_driver(out[i + 1])
        elif arg.startswith(BACKEND + "="):
            out[i] = f"{BACKEND}={with_driver(arg.split('=', 1)[1])}"
    return out


def backend_of(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == BACKEND and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(BACKEND + "="):
            return arg.split("=", 1)[1]
    return None


def check_backend(url: str | None) -> str | None:
    """Why the database backend `url` cannot be used (one line, its password masked); None
    when it answers, or is not a database server."""
    from rul.errors import ConfigError
    from rul.services import ServiceUnavailable, wait_for_database

    if not url or url.split(":")[0].split("+")[0] not in DATABASES:
        return None
    try:
        wait_for_database(url, BACKEND)
    except (ConfigError, ServiceUnavailable) as error:
        return str(error)
    return None


def _given(argv: list[str], *names: str) -> bool:
    return any(arg in names or arg.split("=", 1)[0] in names for arg in argv)


def mlflow_argv(command: str, argv: list[str]) -> list[str]:
    """`mlflow ui|server ARGS...` as rul runs it: its backend under the driver rule (also as the
    registry's), rul's app, for `ui` one worker and no access log, unless ARGS say otherwise."""
    argv = with_backend_driver(argv)
    if not _given(argv, "--app-name"):
        argv += ["--app-name", APP]
    if command == "ui" and not _given(argv, "--workers", "-w"):
        argv += ["--workers", UI_WORKERS]
    if command == "ui" and not _given(argv, "--dev", *SERVER_OPTIONS):
        argv += ["--uvicorn-opts", "--no-access-log"]  # not a line per request
    if backend_of(argv) and not _given(argv, "--registry-store-uri"):
        argv += ["--registry-store-uri", backend_of(argv)]  # MLflow would say it used it
    return [sys.executable, "-m", "mlflow", command, *argv]


def _option(argv: list[str], names: tuple[str, ...], default: str) -> str:
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        if arg.split("=", 1)[0] in names and "=" in arg:
            return arg.split("=", 1)[1]
    return default


def base_url(argv: list[str]) -> str:
    host = _option(argv, ("--host", "-h"), "127.0.0.1")
    port = _option(argv, ("--port", "-p"), "5000")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{port}"


def experiments_of(base: str) -> list[tuple[str, str]]:
    """(id, name) of the UI's experiments, the newest first, MLflow's empty `Default` left
    out when there are others (read through the UI's own REST API)."""
    request = urllib.request.Request(
        f"{base}/api/2.0/mlflow/experiments/search", method="POST",
        data=json.dumps({"max_results": 100, "order_by": ["last_update_time DESC"]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        found = [(e["experiment_id"], e["name"])
                 for e in json.load(response).get("experiments", [])]
    return [e for e in found if e[1] != "Default"] or found


def say_pages_when_ready(base: str, server: subprocess.Popen) -> None:
    """Once the UI answers: a line per experiment with its page (the runs, Model training
    view), or the UI's address when it has none; nothing if it never answers."""
    deadline = time.monotonic() + READY_S
    while server.poll() is None and time.monotonic() < deadline:
        try:
            experiments = experiments_of(base)
        except (OSError, ValueError):
            time.sleep(0.5)
            continue
        lines = [f"experiment {name}: {base}{experiment_page(eid)}"
                 for eid, name in experiments[:PAGES_SHOWN]] or [f"{base}"]
        print("\n".join(["MLflow UI ready (Ctrl-C stops it):", *lines]), file=sys.stderr,
              flush=True)
        return


def main(argv: list[str]) -> int:
    command = "ui"
    if argv and argv[0] in ("ui", "server"):
        command, argv = argv[0], argv[1:]
    refused = check_backend(backend_of(argv))
    if refused:
        print(f"Error: {refused}", file=sys.stderr)
        return 2
    server = subprocess.Popen(mlflow_argv(command, argv), start_new_session=True,
                              env={**ENVIRONMENT, **os.environ})
    if command == "ui":
        threading.Thread(target=say_pages_when_ready, args=(base_url(argv), server),
                         daemon=True).start()

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signum)

    # Ctrl-C is handled explicitly: a process started with SIGINT ignored (a background job
    # of a non-interactive shell, some CI runners) keeps it ignored under Python's default.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)  # the terminal closed
    try:
        return server.wait()
    except KeyboardInterrupt:
        print(f"\nstopping the MLflow {'UI' if command == 'ui' else 'server'}",
              file=sys.stderr)
        return 0  # stopped as asked: make adds no error line
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one stop, however often Ctrl-C comes
        stop_tree(server.pid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

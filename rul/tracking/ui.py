"""`make ui` and `make server`: MLflow's UI or tracking server, its backend store's URL under
rul's driver rule, stopped with every process it started.

A `postgresql://` backend gets the driver rul installs (rul.urls.with_driver: MLflow alone
would look for psycopg 3), and a database backend that answers but refuses (a wrong
password, no such database) is one line before anything starts (its password masked).
`mlflow ui` starts a web server and job consumers (huey) from watcher threads that restart
them when they end, and forwards a signal to the web server only: whether every consumer is
gone when it exits depends on timing. This runs `mlflow ui ARGS...` in its own session and,
when it ends or this process is interrupted, terminated or hung up on, ends the whole tree
(stop_tree): SIGTERM, then SIGKILL for whatever is left after GRACE_S seconds.

    python -m rul.tracking.ui --backend-store-uri sqlite:///mlflow.db --port 5000
    python -m rul.tracking.ui server --backend-store-uri postgresql://... --port 5000
"""

import contextlib
import signal
import subprocess
import sys

import psutil

from rul.urls import with_driver

GRACE_S = 10.0


def stop_tree(pid: int, grace: float = GRACE_S) -> list[int]:
    """End `pid` and all its descendants; return the pids that had to be killed.

    `pid` (mlflow ui) is suspended first, so that its watcher threads cannot start a consumer
    unseen, then its tree is listed and it is killed; the tree gets SIGTERM, and SIGKILL
    whatever is left after `grace` seconds."""
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


def main(argv: list[str]) -> int:
    command = "ui"
    if argv and argv[0] in ("ui", "server"):
        command, argv = argv[0], argv[1:]
    refused = check_backend(backend_of(argv))
    if refused:
        print(f"Error: {refused}", file=sys.stderr)
        return 2
    server = subprocess.Popen([sys.executable, "-m", "mlflow", command,
                               *with_backend_driver(argv)], start_new_session=True)

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
        print(f"\nstopping the MLflow {'UI' if command == 'ui' else 'server'} and its workers",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one stop, however often Ctrl-C comes
        stop_tree(server.pid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make ui`: MLflow's UI, stopped with every process it started.

`mlflow ui` starts a web server and job consumers (huey) from watcher threads that restart
them when they end, and forwards a signal to the web server only: whether every consumer is
gone when it exits depends on timing. This runs `mlflow ui ARGS...` in its own session and,
when it ends or this process is interrupted, terminated or hung up on, ends the whole tree
(stop_tree): SIGTERM, then SIGKILL for whatever is left after GRACE_S seconds.

    python -m rul.tracking.ui --backend-store-uri sqlite:///mlflow.db --port 5000
"""

import contextlib
import signal
import subprocess
import sys

import psutil

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


def main(argv: list[str]) -> int:
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", *argv],
                              start_new_session=True)

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
        print("\nstopping the MLflow UI and its workers", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # one stop, however often Ctrl-C comes
        stop_tree(server.pid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""How an MLflow run ends: never left RUNNING, whatever stops the work inside it."""

from contextlib import contextmanager

from mlflow.tracking import MlflowClient


@contextmanager
def run_ends_cleanly(run_id: str, stop_exceptions: tuple[type[BaseException], ...] = ()):
    """FINISHED on success; KILLED on an interruption (Ctrl-C, SIGTERM); FAILED on an error,
    with the error recorded as the tag `error`. `stop_exceptions` are stops by policy (a
    pruned trial): FINISHED, tagged `stopped`. Exceptions propagate."""
    client = MlflowClient()
    try:
        yield
    except stop_exceptions as stop:
        client.set_tag(run_id, "stopped", str(stop)[:5000])
        client.set_terminated(run_id, status="FINISHED")
        raise
    except BaseException as error:
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        client.set_tag(run_id, "error", f"{type(error).__name__}: {error}"[:5000])
        client.set_terminated(run_id, status=status)
        raise
    client.set_terminated(run_id, status="FINISHED")

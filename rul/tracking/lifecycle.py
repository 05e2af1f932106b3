"""How an MLflow run ends: never left RUNNING, whatever stops the work inside it."""

import sys
from collections.abc import Callable
from contextlib import ExitStack, contextmanager, suppress

import mlflow
from mlflow.tracking import MlflowClient

from rul.interrupts import deferred


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
        _end(client, run_id, status, f"{type(error).__name__}: {error}")
        raise
    client.set_terminated(run_id, status="FINISHED")


def _end(client: MlflowClient, run_id: str, status: str, error: str) -> None:
    """End the run `status`, then record `error` (tag `error`, best effort); a store that
    cannot take the end (a full disk) is one line, unless the run ended anyway."""
    try:
        client.set_terminated(run_id, status=status)
    except Exception as store_error:  # noqa: BLE001 (the store cannot take it: a full disk)
        try:
            ended = client.get_run(run_id).info.status != "RUNNING"
        except Exception:  # noqa: BLE001 (cannot even read it)
            ended = False
        if not ended:
            said = next((line for line in str(store_error).strip().splitlines()
                         if not line.startswith("(raised as a result")), "")[:200]
            print(f"run {run_id} could not be marked {status} ({type(store_error).__name__}: "
                  f"{said}); the next rul command in this experiment closes it",
                  file=sys.stderr)
    with suppress(Exception):
        client.set_tag(run_id, "error", error[:5000])


@contextmanager
def created_run(create: Callable[[], str], stop_exceptions: tuple[type[BaseException], ...] = ()):
    """A new run (`create()` makes it and returns its id), ended as run_ends_cleanly says: an
    interruption while it is created waits until its ending is in place, never left RUNNING."""
    with ExitStack() as ending:
        with deferred():  # created whole, its ending in place, then the signal
            run_id = create()
            ending.enter_context(run_ends_cleanly(run_id, stop_exceptions))
        yield run_id


@contextmanager
def active_run(run_id: str, nested: bool = False):
    """`run_id` as MLflow's active run for the block (mlflow.start_run), ended after it. When
    the block fails, the end's own write may fail too (a full disk): it must not hide the
    block's error, which run_ends_cleanly records (MLflow pops the run before writing)."""
    mlflow.start_run(run_id=run_id, nested=nested)
    try:
        yield
    except BaseException:
        with suppress(Exception):
            mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run()


@contextmanager
def written_to(run_id: str, nested: bool = False):
    """`run_id` as MLflow's active run for the block's writes, and RUNNING again after it (the
    fluent API ends it): for a run whose work goes on outside the block (rul.workflows.stacked)."""
    with active_run(run_id, nested):
        yield
    MlflowClient().update_run(run_id, status="RUNNING")

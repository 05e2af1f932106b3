"""An ensemble's members trained stacked (rul.training.stacked), each in its own MLflow run.

What `track` does for one plan, done for several at once: every member's run is created and
its plan logged before training starts, each run's lock held (so a process killed even with
SIGKILL leaves runs the next command closes), each member's steps and epochs logged to its
own run by its own listener, then each member's results and model. However the training
ends, every run ends with it: FINISHED, KILLED on an interruption, FAILED on an error. The
members are children that are never resumed: no checkpoint is written.
"""

from contextlib import ExitStack
from functools import partial

from mlflow.tracking import MlflowClient

from rul.interrupts import deferred
from rul.tracking.lifecycle import active_run, created_run, written_to
from rul.tracking.mlflow_listener import MLflowListener
from rul.tracking.run_checkpoints import RunCheckpoints
from rul.tracking.run_logging import log_outcome, log_plan
from rul.tracking.store import Store
from rul.training.stacked import train_members
from rul.workflows.tracked import RunRole, open_run


def track_stacked(plans: list, roles: list[RunRole], store: Store, progress: bool = True
                  ) -> list[tuple]:
    """Train the members `plans` stacked, member i in an MLflow run in roles[i] (children
    never registered nor resumed), in `store`; return [(outcome, run_id)] in their order."""
    if any(role.register or role.resumable or role.on_run_created for role in roles):
        raise ValueError("stacked members are children: never registered, resumed or reported")
    checkpoints = RunCheckpoints(plans[0].config.checkpoint_dir)
    checkpoints.close_abandoned(MlflowClient(), store.experiment_id)
    with ExitStack() as runs:
        run_ids = []
        for plan, role in zip(plans, roles, strict=True):
            run_id = runs.enter_context(created_run(partial(open_run, plan, role,
                                                            store.experiment_id)))
            run_ids.append(run_id)
            runs.enter_context(checkpoints.held(run_id))  # its lock: alive while it trains
            with deferred(), written_to(run_id, nested=role.parent_run_id is not None):
                log_plan(plan, role.tags)  # whole, and the run RUNNING again, then the signal
        trackers = [MLflowListener.of(plan, run_id)
                    for plan, run_id in zip(plans, run_ids, strict=True)]
        outcomes = train_members(plans, trackers, progress)
        for outcome, run_id, role in zip(outcomes, run_ids, roles, strict=True):
            # results whole, then the signal
            with active_run(run_id, nested=role.parent_run_id is not None), deferred():
                log_outcome(outcome)
    return list(zip(outcomes, run_ids, strict=True))

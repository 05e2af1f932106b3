"""An ensemble's members trained stacked (rul.training.stacked), each in its own MLflow run.

What `track` does for one plan, done for several at once: every member's run is created and
its plan logged before training starts, each run's lock held (so a process killed even with
SIGKILL leaves runs the next command closes), each member's steps and epochs logged to its
own run by its own listener, then each member's results and model, its run ending FINISHED
once they are logged. However the training ends, every run still open ends with it: KILLED
on an interruption, FAILED on an error. The members are children that are never resumed: no
checkpoint is written.
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
        run_ids, endings = [], []
        for plan, role in zip(plans, roles, strict=True):
            ending = runs.enter_context(ExitStack())  # this member's: its run's end, its lock
            run_id = ending.enter_context(created_run(partial(open_run, plan, role,
                                                              store.experiment_id)))
            ending.enter_context(checkpoints.held(run_id))  # its lock: alive while it trains
            run_ids.append(run_id)
            endings.append(ending)
            with deferred(), written_to(run_id, nested=role.parent_run_id is not None):
                log_plan(plan, role.tags)  # whole, and the run RUNNING again, then the signal
        trackers = [MLflowListener.of(plan, run_id)
                    for plan, run_id in zip(plans, run_ids, strict=True)]
        outcomes = train_members(plans, trackers, progress)
        for outcome, run_id, role, ending in zip(outcomes, run_ids, roles, endings,
                                                 strict=True):
            # results whole and the run ended FINISHED, then the signal: an interruption
            # while a later member is logged leaves this one FINISHED (as one after another)
            with deferred():
                with active_run(run_id, nested=role.parent_run_id is not None):
                    log_outcome(outcome)
                ending.close()
    return list(zip(outcomes, run_ids, strict=True))

"""A tracked training: one MLflow run wraps one plan, never left RUNNING.

Everything that can be checked runs while the plan is built (rul.plan), before the MLflow run
exists: the config, the data files, the window against the units' lengths, the memory
budget. A bad input creates no run. Then `track` opens the run (or reopens the one the plan
resumes) in the command's store, logs the plan, attaches the MLflow listener, trains, logs
the outcome and, when the run's role says so, registers the model.
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import mlflow
from mlflow.tracking import MlflowClient
from mlflow.utils import mlflow_tags

from rul.interrupts import deferred
from rul.tracking.lifecycle import active_run, created_run
from rul.tracking.mlflow_listener import MLflowListener
from rul.tracking.registry import register_and_promote, registered_model_name
from rul.tracking.run_checkpoints import RunCheckpoints, run_text
from rul.tracking.run_logging import log_outcome, log_plan, source_tags
from rul.tracking.run_names import CONFIG_DIGEST_TAG, config_digest, default_run_name
from rul.tracking.run_owner import reopen
from rul.tracking.selection import Challenger, rescored
from rul.tracking.store import Store
from rul.training.listener import Listeners, TrainingListener
from rul.training.run import train


@dataclass(frozen=True)
class RunRole:
    """Where a tracked run sits and how it ends; the defaults are `rul train`'s own run."""

    parent_run_id: str | None = None
    name: str | None = None  # default: the config's run_name, else default_run_name
    tags: dict = field(default_factory=dict)  # e.g. a child's index, a trial's study
    register: bool = True  # register the model (the champion moves if it is better)
    resumable: bool = True  # False: the checkpoint goes however the run ends
    stop_exceptions: tuple[type[BaseException], ...] = ()  # stops by policy: FINISHED
    on_run_created: Callable[[str], None] | None = None  # called with the new run's id

    def under(self, parent_run_id: str) -> "RunRole":
        return replace(self, parent_run_id=parent_run_id)


OWN_RUN = RunRole()  # a run of its own: registered, resumable (`rul train` sets register)
# A seed of `rul evaluate`, an ensemble member: a child that is never registered or resumed.
CHILD = RunRole(register=False, resumable=False)


def track(plan, role: RunRole, store: Store, listener: TrainingListener | None = None,
          progress: bool = True):
    """Train `plan` inside an MLflow run in `role`, in `store`; return (outcome, run_id).

    On any exception the run ends FAILED or KILLED with the error recorded and nothing is
    registered; role.stop_exceptions (a pruned trial) end it FINISHED. See
    rul.tracking.lifecycle."""
    config = plan.config
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    checkpoints.close_abandoned(MlflowClient(), store.experiment_id, plan.resume_run_id)
    if role.resumable and plan.resume_run_id is None:
        _say_runs_training_now(checkpoints, store.experiment_id, config_digest(plan.written))
    created = []

    def create() -> str:  # the run and its identity are written whole, or not at all
        created.append(open_run(plan, role, store.experiment_id))
        if role.on_run_created is not None:
            role.on_run_created(created[0])
        return created[0]

    try:
        with created_run(create, role.stop_exceptions) as run_id, \
                checkpoints.held(run_id) as checkpointer, \
                active_run(run_id, nested=role.parent_run_id is not None):
            outcome = _train_in_run(plan, role, checkpointer, listener, progress)
            with deferred():  # results, model and registration: whole, then the signal
                log_outcome(outcome)
                if role.register:
                    register_and_promote(outcome.model_uri,
                                         registered_model_name(config.dataset_name), run_id,
                                         outcome.state.best_val_rmse,
                                         partial(rescored, challenger=Challenger.of(outcome),
                                                 client=MlflowClient()))
        checkpoints.remove(run_id)  # finished: the model lives in MLflow
        return outcome, run_id
    finally:
        if created and not role.resumable:
            checkpoints.remove(created[0])


def _say_runs_training_now(checkpoints: RunCheckpoints, experiment_id: str,
                           digest: str) -> None:
    """One line per run of this config another process trains in this store: both go on,
    each its own run and checkpoint, each registered."""
    for run in checkpoints.training_now(MlflowClient(), experiment_id, digest):
        print(f"note: run {run_text(run)} of this config is training in this store too; both "
              "go on, each its own run and checkpoint", file=sys.stderr)


def open_run(plan, role: RunRole, experiment_id: str) -> str:
    """The run to train in: the one the plan resumes (marked RUNNING again), or a new one,
    created with its identity tags and the role's tags, so that a process killed right
    after creating it leaves no untagged run."""
    client = MlflowClient()
    if plan.resume_run_id is not None:
        reopen(client, plan.resume_run_id)
        return plan.resume_run_id
    tags = {**source_tags(), **role.tags, CONFIG_DIGEST_TAG: config_digest(plan.written)}
    if role.parent_run_id:
        tags[mlflow_tags.MLFLOW_PARENT_RUN_ID] = role.parent_run_id
    name = (role.name or plan.config.run_name
            or default_run_name(plan.config, plan.world.size))
    return client.create_run(experiment_id, tags=tags, run_name=name).info.run_id


def _train_in_run(plan, role: RunRole, checkpointer, listener, progress: bool):
    """Inside the active run: log the plan (a new run) or say where it resumes, and for a run
    of its own its precision and why, then train."""
    if role.parent_run_id is None:
        print(plan.precision.said, file=sys.stderr)
    if plan.resume is None:
        with deferred():
            log_plan(plan, role.tags)
    else:
        print(f"resuming run {plan.resume_run_id} after epoch "
              f"{plan.resume['train_state']['epoch']}", file=sys.stderr)
    tracker = MLflowListener.of(plan, mlflow.active_run().info.run_id)
    if plan.resume is not None:
        tracker.catch_up(plan.resume["train_state"])
    return train(plan, Listeners(tracker, listener), checkpointer, progress)

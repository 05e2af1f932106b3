"""Several tracked trainings under one MLflow parent run, never left RUNNING.

Shared by `rul evaluate` (each child a seed: a complete, independent training) and ensembles
(each child a member). The callers build every child's plan first, so a bad input creates
no run; then the parent is created in the command's store, each child trains as a normal
tracked run under it (one after another, or `jobs` at a time in worker processes:
rul.parallel), and `summarize` logs what the parent holds. An interruption ends the children
and the parent KILLED, an error FAILED.
"""

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import mlflow
from mlflow.tracking import MlflowClient
from mlflow.utils import mlflow_tags

from rul.interrupts import deferred
from rul.parallel import run_tasks
from rul.tracking.lifecycle import created_run
from rul.tracking.run_logging import source_tags
from rul.tracking.store import Store


@dataclass
class ChildRun:
    outcome: object  # a TrainingOutcome, or an EnsembleOutcome for an evaluated ensemble
    run_id: str
    seconds: float  # wall time of its training (and of those trained with it), logging included

    @property
    def seed(self) -> int:
        return self.outcome.plan.config.seed


@dataclass
class Children:
    parent_run_id: str
    runs: list[ChildRun]
    seconds: float  # wall time of all children


def train_under_parent(role, store: Store, tasks: Sequence[Callable], summarize: Callable,
                       jobs: int = 1):
    """Create the parent run in `store` (`role`: its name, tags and own parent), run each
    task (`task(parent_run_id) -> [(outcome, run_id)]`: one child, or several trained
    together; a picklable callable when jobs > 1), then call `summarize(children)` with the
    parent as the active run; return (children, what summarize returned)."""
    tags = {**source_tags(), **role.tags}
    if role.parent_run_id:
        tags[mlflow_tags.MLFLOW_PARENT_RUN_ID] = role.parent_run_id

    def create() -> str:  # the parent is created whole, or not at all
        return MlflowClient().create_run(store.experiment_id, tags=tags,
                                         run_name=role.name).info.run_id

    started = time.perf_counter()
    with created_run(create) as parent_id:
        done = run_tasks([partial(task, parent_id) for task in tasks], jobs,
                         on_done=_report if jobs > 1 else None)
        runs = [ChildRun(*child, seconds) for children, seconds in done for child in children]
        finished = Children(parent_id, runs, time.perf_counter() - started)
        with deferred(), mlflow.start_run(run_id=parent_id):  # whole, then the signal
            summary = summarize(finished)
    return finished, summary


def _report(index: int, children: list, seconds: float) -> None:
    for outcome, run_id in children:
        print(f"child {index} (seed {outcome.plan.config.seed}) done in {seconds:.0f} s: test RMSE "
              f"{outcome.metrics['test_rmse']:.2f}, run {run_id}", file=sys.stderr)

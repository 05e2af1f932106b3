"""`rul evaluate`: how good a config is, as mean ± std over N seeds, not one lucky run.

Seed i trains `config` with seed + i x ensemble (rul.plan.plan_seeds), a complete training
each: its own validation split, weight init and batch order. Nothing is selected on the test
set: each seed's model is the one its own early stopping kept on its validation units, and
every seed is reported (rul.evaluation.seeds). The parent run holds the aggregates
(`<metric>_mean`, `<metric>_std`), the per-seed table `seeds.json` and the wall time; the
children are normal training runs (ensemble runs for ensemble > 1), none registered. With
jobs > 1 the seeds train side by side in worker processes (rul.parallel).
"""

from dataclasses import replace
from functools import partial

import mlflow

from rul.evaluation.seeds import Evaluation, aggregate, reported_metrics
from rul.plan import EnsemblePlan, plan_seeds
from rul.preprocessing.features import track as track_of
from rul.tracking.metric_names import logged_metrics
from rul.tracking.parent_run import INDEX_TAG, KIND_TAG, SEEDS_TAG, log_parent_config
from rul.tracking.run_names import default_run_name
from rul.tracking.store import Store, open_store
from rul.workflows.ensemble import track_ensemble
from rul.workflows.parent import train_under_parent
from rul.workflows.tracked import CHILD, RunRole, track


def evaluate_seeds(config, n_seeds: int, jobs: int = 1, progress: bool = True) -> Evaluation:
    if n_seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {n_seeds}")
    plans = plan_seeds(config, n_seeds)  # every seed's data and split checked before any run
    store = open_store(config)
    name = f"evaluate-{config.run_name or default_run_name(config)}-x{n_seeds}"
    children = [partial(_track_seed, plan, _seed_role(config, index, plan), store,
                        progress and jobs == 1) for index, plan in enumerate(plans)]
    seeds = [plan.config.seed for plan in plans]
    parent = RunRole(name=name, tags={KIND_TAG: "evaluate", SEEDS_TAG: ",".join(map(str, seeds))})

    def summarize(done) -> Evaluation:
        rows = [{"seed": r.seed, "run_id": r.run_id, **reported_metrics(r.outcome),
                 "seconds": r.seconds} for r in done.runs]
        evaluation = Evaluation(done.parent_run_id, name, rows, aggregate(rows), done.seconds,
                                track_of(config.include_cycle))
        first = plans[0].members[0] if isinstance(plans[0], EnsemblePlan) else plans[0]
        log_parent_config(config, first.data, seeds=n_seeds)
        mlflow.log_metrics(logged_metrics({**evaluation.aggregates, "wall_time_s": done.seconds}))
        mlflow.log_table({k: [row[k] for row in rows] for k in rows[0]}, "seeds.json")
        return evaluation

    return train_under_parent(parent, store, children, summarize, jobs)[1]


def _seed_role(config, index: int, plan) -> RunRole:
    name = None
    if config.run_name and not isinstance(plan, EnsemblePlan):
        name = f"{config.run_name}-s{plan.config.seed}"
    return replace(CHILD, name=name, tags={INDEX_TAG: str(index)})


def _track_seed(plan, role: RunRole, store: Store, progress: bool, parent_run_id: str):
    if isinstance(plan, EnsemblePlan):
        return [track_ensemble(plan, role.under(parent_run_id), store, progress=progress)]
    return [track(plan, role.under(parent_run_id), store, progress=progress)]

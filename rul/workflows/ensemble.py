"""`rul train ... ensemble=N`: N members under one parent run, logged as ONE averaged model.

The members' plans come from rul.plan.plan_ensemble (member i: seed + i; the shared split of
`seed`, or fold i), which also decides whether they train one after another or stacked
(rul.workflows.stacked). Each member is a normal child run (its own model logged, not
registered). The parent holds the ensemble (rul.evaluation.ensemble): its params, the
metrics of the averaged prediction (test metrics for reporting only), figures, the pyfunc
model with every member's weights, and the registered version, which becomes champion only
when its val_rmse beats the champion's.
"""

import sys
from dataclasses import replace
from functools import partial

import mlflow
from mlflow.tracking import MlflowClient

from rul.evaluation import figures
from rul.evaluation.ensemble import EnsembleOutcome, combine
from rul.plan import plan_ensemble
from rul.tracking.metric_names import logged_metrics
from rul.tracking.parent_run import INDEX_TAG, KIND_TAG, SEEDS_TAG, log_parent_config
from rul.tracking.registry import register_and_promote, registered_model_name
from rul.tracking.run_logging import log_figures, log_model_and_predictions
from rul.tracking.run_names import default_run_name
from rul.tracking.selection import (
    ENGINES_FILE,
    Challenger,
    engines_record,
    evidence_of,
    rescored,
)
from rul.tracking.store import Store, open_store
from rul.workflows.parent import Children, train_under_parent
from rul.workflows.stacked import track_stacked
from rul.workflows.tracked import CHILD, RunRole, track

MEMBER_TAG = "ensemble.member"
FOLD_TAG = "ensemble.fold"  # ensemble_split: folds, the fold a member validates on
TRAINING_TAG = "ensemble.training"  # how the members trained: stacked or sequential
TRAINING_REASON_TAG = "ensemble.training.reason"  # and why


def train_ensemble(config, jobs: int = 1, progress: bool = True, subset=None
                   ) -> tuple[EnsembleOutcome, str]:
    """`rul train ... ensemble=N`: plan the members (on `subset` when its files are already
    read) and track the ensemble as the config says (registered when config.register);
    return (outcome, the ensemble's run id)."""
    ensemble = plan_ensemble(config, subset, jobs)  # a bad input opens no store, no run
    store = open_store(config)
    print(ensemble.members[0].precision.said, file=sys.stderr)
    return track_ensemble(ensemble, RunRole(register=config.register), store, jobs, progress)


def track_ensemble(ensemble, role: RunRole, store: Store, jobs: int = 1, progress: bool = True
                   ) -> tuple[EnsembleOutcome, str]:
    """Train an EnsemblePlan's members (`jobs` at a time) and log the ensemble in `role`, in
    `store`; return (outcome, the ensemble's run id)."""
    config, training = ensemble.config, ensemble.training
    split = str(ensemble.members[0].seeds.split)  # the shared split's (or folds') seed
    roles = [_member_role(config, index, split, training.name)
             for index in range(len(ensemble.members))]
    if training.stacked:  # one task: every member at once
        if training.note:
            print(training.note, file=sys.stderr)
        tasks = [partial(_track_stacked, ensemble.members, roles, store, progress)]
    else:
        tasks = [partial(_track_member, plan, member_role, store, progress and jobs == 1)
                 for plan, member_role in zip(ensemble.members, roles, strict=True)]
    name = role.name or (f"ensemble-{config.run_name or default_run_name(config)}"
                         f"-x{config.ensemble}")
    parent = RunRole(role.parent_run_id, name, {
        KIND_TAG: "ensemble", SEEDS_TAG: ",".join(str(p.config.seed) for p in ensemble.members),
        TRAINING_TAG: training.name, TRAINING_REASON_TAG: training.reason, **role.tags})

    def summarize(children: Children) -> EnsembleOutcome:
        outcome = combine(ensemble, [child.outcome for child in children.runs])
        outcome.member_run_ids = [child.run_id for child in children.runs]
        _log_ensemble(outcome, children.seconds, split)
        if role.register:
            register_and_promote(outcome.model_uri, registered_model_name(config.dataset_name),
                                 children.parent_run_id, outcome.metrics["val_rmse"],
                                 partial(rescored, challenger=Challenger.of(outcome),
                                         client=MlflowClient()))
        return outcome

    children, outcome = train_under_parent(parent, store, tasks, summarize, jobs)
    return outcome, children.parent_run_id


def _member_role(config, index: int, split: str, training: str) -> RunRole:
    fold = {FOLD_TAG: str(index)} if config.ensemble_split == "folds" else {}
    return replace(CHILD, name=f"{config.run_name}-m{index}" if config.run_name else None,
                   tags={INDEX_TAG: str(index), MEMBER_TAG: str(index), "seed.split": split,
                         TRAINING_TAG: training, **fold})


def _track_member(plan, role: RunRole, store: Store, progress: bool, parent_run_id: str):
    return [track(plan, role.under(parent_run_id), store, progress=progress)]


def _track_stacked(plans, roles: list[RunRole], store: Store, progress: bool,
                   parent_run_id: str):
    return track_stacked(plans, [role.under(parent_run_id) for role in roles], store, progress)


def _log_ensemble(outcome: EnsembleOutcome, seconds: float, split: str) -> None:
    """On the active (parent) run."""
    config = outcome.plan.config
    log_parent_config(config, outcome.data, members=config.ensemble)
    mlflow.set_tags({"ensemble.member_runs": ",".join(outcome.member_run_ids),
                     "ensemble.split": config.ensemble_split, "seed.split": split,
                     **evidence_of(outcome).tags()})
    mlflow.log_dict(engines_record([m.data for m in outcome.members]), ENGINES_FILE)
    mlflow.log_metrics(logged_metrics({**outcome.metrics, "wall_time_s": seconds}))
    log_figures({
        "member_val_curves.png": figures.member_val_curves(outcome.members,
                                                           config.ensemble_split),
        "predicted_vs_true.png": figures.predicted_vs_true(outcome.predictions),
        "error_histogram.png": figures.error_histogram(outcome.predictions),
    })
    log_model_and_predictions(outcome)

"""`rul train ... ensemble=N`: N members under one parent run, logged as ONE averaged model.

Member i trains `config` with seed = seed + i (its weight init, dropout and batch order). With
`ensemble_split: shared` every member validates on the split of `seed`: the split, and so the
preprocessing fitted on the training units, does not depend on the member. With `folds` the
training units are cut into N folds (seed's permutation) and member i early-stops on fold i,
training on the others; the preprocessing is fitted once on all of them
(rul.workflow.prepare_folds). Each member is a normal child run (its own model logged, not
registered). The parent holds the ensemble: its params, the metrics of the averaged prediction
(val_rmse: each validation window predicted by the mean of the members that validate on it,
so for `shared` the averaged prediction on the shared validation windows, the same measure as
a single run's best_val_rmse, and for `folds` the out-of-fold RMSE over every training unit;
test metrics for reporting only), figures, the pyfunc model with every member's weights, and
the registered version, which becomes champion only when its val_rmse beats the champion's.
"""

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from rul.config import Config
from rul.evaluation.conformal import Interval
from rul.evaluation.metrics import rmse, rul_metrics
from rul.serving.predictor import average_members
from rul.tracking import figures
from rul.tracking.multi_seed import INDEX_TAG, SeededRuns, log_config, spaced_seeds, train_seeds
from rul.tracking.pyfunc_model import log_ensemble_pyfunc
from rul.tracking.registry import register_and_promote, registered_model_name
from rul.tracking.tracked_run import default_run_name, train_tracked
from rul.training.batching import WindowBatches
from rul.training.evaluate import predict_windows
from rul.training.seeding import derive_seeds
from rul.workflow import PreparedData, TrainingOutcome, add_interval, prepare_members

MEMBER_TAG = "ensemble.member"
FOLD_TAG = "ensemble.fold"  # ensemble_split: folds, the fold a member validates on


@dataclass
class EnsembleOutcome:
    config: Config  # ensemble=N; seed: the first member's, whose split (or folds) they share
    data: PreparedData  # the first member's: the shared preprocessor and test windows
    members: list[TrainingOutcome]
    metrics: dict  # val_rmse and test metrics of the averaged prediction, members' means
    predictions: pd.DataFrame  # unit, true_rul, true_rul_capped, predicted_rul, predicted_std
    interval: Interval | None = None  # calibrated on the averaged validation predictions
    member_run_ids: list[str] = field(default_factory=list)
    model_uri: str | None = None

    @property
    def models(self) -> list:
        return [m.model for m in self.members]


def member_seeds(config: Config) -> list[int]:
    return spaced_seeds(config.seed, config.ensemble)


def _averaged(members: list[TrainingOutcome], windows) -> tuple[np.ndarray, np.ndarray]:
    predictions = []
    for m in members:
        batches = WindowBatches(windows, m.precision.device)
        predictions.append(predict_windows(m.model, batches))
    return average_members(predictions)


def validation_residuals(members: list[TrainingOutcome]) -> np.ndarray:
    """Predicted - capped target for every validation window of the members, each window
    predicted by the mean of the members that validate on it: all of them on one shared split,
    only its own member on a fold (out-of-fold). Members share a split by sharing their data."""
    groups: dict[int, list[TrainingOutcome]] = {}
    for m in members:
        groups.setdefault(id(m.data), []).append(m)
    return np.concatenate([_averaged(group, group[0].data.val)[0] - group[0].data.val.targets
                           for group in groups.values()])


def combine(config: Config, members: list[TrainingOutcome]) -> EnsembleOutcome:
    """The ensemble of trained `members`: its averaged predictions and metrics. Nothing here
    is chosen on the test units; the test windows are the same for every member."""
    data = members[0].data
    residuals = validation_residuals(members)
    test_mean, test_std = _averaged(members, data.test)
    test = rul_metrics(test_mean, data.subset.test_rul, config.rul_cap)
    metrics = {
        "val_rmse": rmse(residuals, 0.0),
        **{f"test_{k}": v for k, v in test.items()},
        "member_val_rmse_mean": float(np.mean([m.state.best_val_rmse for m in members])),
        "member_test_rmse_mean": float(np.mean([m.metrics["test_rmse"] for m in members])),
    }
    predictions = pd.DataFrame({"unit": data.test_units, "true_rul": data.subset.test_rul,
                                "true_rul_capped": data.test.targets,
                                "predicted_rul": test_mean, "predicted_std": test_std})
    interval = None
    if config.interval_coverage is not None:
        interval = add_interval(residuals, data, config, predictions, metrics)
    return EnsembleOutcome(config, data, members, metrics, predictions, interval)


def train_ensemble(config: Config, data: list[PreparedData] | None = None,
                   progress: bool = True, parent_run_id: str | None = None,
                   register: bool | None = None, extra_tags: dict | None = None
                   ) -> tuple[EnsembleOutcome, str]:
    """Train config.ensemble members and log the ensemble; return (outcome, its run id).
    `data`: each member's (rul.workflow.prepare_members). `parent_run_id`: the ensemble's run
    is itself a child (of an evaluation)."""
    data = data if data is not None else prepare_members(config)  # checks, before any run
    split_tag = {"seed.split": str(derive_seeds(config.seed).split)}  # the split's (or folds')

    def train_member(index: int, seed: int, parent: str):
        member = config.replace(seed=seed, ensemble=1, ensemble_split="shared", register=False)
        fold = {FOLD_TAG: str(index)} if config.ensemble_split == "folds" else {}
        return train_tracked(member, progress=progress, parent_run_id=parent,
                             run_name=f"{config.run_name}-m{index}" if config.run_name else None,
                             extra_tags={INDEX_TAG: str(index), MEMBER_TAG: str(index),
                                         **split_tag, **fold},
                             register=False, resumable=False, data=data[index])

    def summarize(runs: SeededRuns) -> EnsembleOutcome:
        outcome = combine(config, [r.outcome for r in runs.runs])
        outcome.member_run_ids = [r.run_id for r in runs.runs]
        _log_ensemble(outcome, runs)
        if config.register if register is None else register:
            register_and_promote(outcome.model_uri, registered_model_name(config.subset),
                                 runs.parent_run_id, outcome.metrics["val_rmse"])
        return outcome

    name = f"ensemble-{config.run_name or default_run_name(config)}-x{config.ensemble}"
    runs, outcome = train_seeds(config, member_seeds(config), kind="ensemble", run_name=name,
                                train_one=train_member, summarize=summarize,
                                parent_run_id=parent_run_id, tags=extra_tags)
    return outcome, runs.parent_run_id


def _log_ensemble(outcome: EnsembleOutcome, runs: SeededRuns) -> None:
    """On the active (parent) run."""
    config = outcome.config
    log_config(config, outcome.data, {"members": config.ensemble})
    mlflow.set_tags({"ensemble.member_runs": ",".join(outcome.member_run_ids),
                     "ensemble.split": config.ensemble_split,
                     "seed.split": str(derive_seeds(config.seed).split)})
    mlflow.log_metrics({**outcome.metrics, "wall_time_s": runs.seconds})
    for name, fig in (
        ("member_val_curves.png", member_val_curves(outcome.members, config.ensemble_split)),
        ("predicted_vs_true.png", figures.predicted_vs_true(outcome.predictions)),
        ("error_histogram.png", figures.error_histogram(outcome.predictions)),
    ):
        mlflow.log_figure(fig, f"figures/{name}")
    with tempfile.TemporaryDirectory() as scratch:
        outcome.model_uri = log_ensemble_pyfunc(outcome, Path(scratch) / "model")
        outcome.predictions.to_csv(Path(scratch) / "test_predictions.csv", index=False)
        mlflow.log_artifact(str(Path(scratch) / "test_predictions.csv"))


def member_val_curves(members: list[TrainingOutcome], split: str = "shared") -> Figure:
    """Each member's validation RMSE per epoch (on the shared validation units, or each on
    its own fold)."""
    fig = Figure(figsize=(6, 3.5), layout="tight")
    ax = fig.subplots()
    for m in members:
        values = [h["val_rmse"] for h in m.state.history]
        ax.plot(np.arange(1, len(values) + 1), values, label=f"seed {m.config.seed}")
    title = "ensemble members" + (", each on its own fold" if split == "folds" else "")
    ax.set(xlabel="epoch", ylabel="validation RMSE (cycles)", title=title)
    ax.legend(fontsize="small")
    return fig

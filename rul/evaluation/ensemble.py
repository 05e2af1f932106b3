"""An ensemble of trained members: their averaged prediction, its metrics and its interval.

Nothing here is chosen on the test units; the test windows are the same for every member.
The validation figure depends on how the members split the training units: on one shared
split, the averaged prediction on the shared validation windows (the same measure as a single
run's best_val_rmse); on folds, the out-of-fold RMSE over every training unit (each window
predicted by the one member that validates on it).
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rul.evaluation.averaging import average_members
from rul.evaluation.conformal import Interval
from rul.evaluation.intervals import CalibrationSet, calibrate_interval
from rul.evaluation.metrics import rmse
from rul.evaluation.scoring import score_test
from rul.evaluation.truncation import window_weights


@dataclass
class EnsembleOutcome:
    plan: object  # the ensemble's plan (rul.plan.EnsemblePlan): its members' share the split
    members: list  # TrainingOutcome of each member (rul.training.run): each predicts windows
    metrics: dict  # val_rmse and test metrics of the averaged prediction, members' means
    predictions: pd.DataFrame  # unit, true_rul, true_rul_capped, predicted_rul, predicted_std
    interval: Interval | None = None  # calibrated on the averaged validation predictions
    member_run_ids: list[str] = field(default_factory=list)
    model_uri: str | None = None

    @property
    def data(self):
        """The first member's: the shared preprocessor and test windows."""
        return self.members[0].data

    @property
    def network_spec(self):
        """The members' network (one architecture, their own weights)."""
        return self.members[0].plan.network

    @property
    def models(self) -> list:
        return [m.model for m in self.members]


def averaged(members: list, windows) -> tuple[np.ndarray, np.ndarray]:
    """The members' mean prediction of each window of `windows` and their spread."""
    return average_members([m.predict(windows) for m in members])


def validation_predictions(members: list) -> CalibrationSet:
    """Every validation window of the members, each predicted by the mean of the members
    that validate on it: all of them on one shared split, only its own member on a fold
    (out-of-fold)."""
    groups: dict[bytes, list] = {}
    for m in members:
        groups.setdefault(np.asarray(m.data.val_units).tobytes(), []).append(m)
    return CalibrationSet.joined([CalibrationSet.of(averaged(group, group[0].data.val)[0],
                                                    group[0].data.val)
                                  for group in groups.values()])


def combine(plan, members: list) -> EnsembleOutcome:
    """The ensemble of `plan` (its EnsemblePlan) from its trained `members`: its averaged
    predictions and metrics, scored as the first member's plan says."""
    data, first = members[0].data, members[0].plan
    validation = validation_predictions(members)
    test_mean, test_std = averaged(members, data.test)
    test, predictions = score_test(test_mean, data, first.network.rul_cap)
    weights = window_weights(first.loop.val_weights, validation.units, validation.window,
                             first.seeds.split)
    metrics = {
        "val_rmse": rmse(validation.predicted, validation.targets, weights),
        **test,
        "member_val_rmse_mean": float(np.mean([m.state.best_val_rmse for m in members])),
        "member_test_rmse_mean": float(np.mean([m.metrics["test_rmse"] for m in members])),
    }
    predictions = predictions.assign(predicted_std=test_std)
    interval, predictions, metrics = calibrate_interval(
        lambda: validation, first.interval_coverage, first.network.rul_cap, first.seeds.split,
        predictions, metrics)
    return EnsembleOutcome(plan, members, metrics, predictions, interval)

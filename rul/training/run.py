"""Execute a plan: build its network, fit it, predict the test units, calibrate the interval.

Tracking plugs in through the engine's TrainingListener and a Checkpointer; this module knows
nothing about MLflow. Under torchrun every rank executes its own plan (rank 0 with the
tracking listener and checkpointer, the others with neither) and evaluates the test units
itself (identical numbers).
"""

import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.evaluation.conformal import Interval
from rul.evaluation.intervals import CalibrationSet, calibrate_interval
from rul.evaluation.scoring import score_test
from rul.training.batching import WindowBatches, split_note
from rul.training.checkpoint import Checkpointer
from rul.training.engine import TrainState, fit
from rul.training.listener import TrainingListener
from rul.training.predict import predict_windows
from rul.training.seeding import seed_everything
from rul.training.settings import TrainingPlan


@dataclass
class TrainingOutcome:
    plan: TrainingPlan  # the plan that was executed (a rul.plan.RunPlan)
    model: object
    state: TrainState
    metrics: dict  # test metrics + best_epoch
    predictions: pd.DataFrame  # unit, true_rul, predicted_rul (+ its interval's bounds)
    interval: Interval | None = None  # calibrated on the validation windows; None: disabled
    model_uri: str | None = None  # set once the model is logged to MLflow

    # plan, data, network_spec, models: what an EnsembleOutcome has too (read alike by the
    # model logging and a parent's children); anything else of the plan is outcome.plan's.
    @property
    def data(self):
        return self.plan.data

    @property
    def network_spec(self):
        return self.plan.network

    @property
    def models(self) -> list:
        return [self.model]

    def predict(self, windows) -> np.ndarray:
        """The model's prediction of each window of `windows` (a WindowSet), on its device."""
        device = next(self.model.parameters()).device
        return predict_windows(self.model, WindowBatches(windows, device))


def train(plan: TrainingPlan, listener: TrainingListener | None = None,
          checkpointer: Checkpointer | None = None, progress: bool = True) -> TrainingOutcome:
    """Train `plan`'s network (from its checkpoint when it resumes one) and evaluate it on
    the test units."""
    loop = plan.loop
    notes = [split_note(loop.effective_batch_size, loop.micro_batch_size),
             plan.precision.emulated]
    for note in notes if plan.world.is_main and plan.resume is None else []:
        if note:
            print(note, file=sys.stderr)
    seed_everything(plan.seeds, loop.deterministic)
    model = plan.network.build().to(plan.device)
    state = fit(model, plan, listener, checkpointer, progress)
    return outcome_of(plan, model, state)


def outcome_of(plan: TrainingPlan, model, state: TrainState) -> TrainingOutcome:
    """A trained `model` of `plan` (its best weights loaded), evaluated: its test metrics and
    predictions, and the interval calibrated on its validation windows."""
    device, data, cap = plan.device, plan.data, plan.network.rul_cap
    predicted = predict_windows(model, WindowBatches(data.test, device))
    test, predictions = score_test(predicted, data, cap)
    metrics = {**test, "best_epoch": state.best_epoch, "best_val_rmse": state.best_val_rmse}
    interval, predictions, metrics = calibrate_interval(
        lambda: CalibrationSet.of(predict_windows(model, WindowBatches(data.val, device)),
                                  data.val),
        plan.interval_coverage, cap, plan.seeds.split, predictions, metrics)
    return TrainingOutcome(plan, model, state, metrics, predictions, interval)

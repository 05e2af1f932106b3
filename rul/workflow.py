"""One training end to end: data -> preprocessing -> model -> fit -> test metrics.

Tracking plugs in through the engine's TrainingListener; this module knows nothing about MLflow.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.config import Config, ConfigError
from rul.data import CMAPSSSubset, load_subset
from rul.data.split import fold_units, rows_of, split_units
from rul.evaluation.conformal import Interval, fit_conformal, interval_scores, min_calibration_size
from rul.evaluation.metrics import rul_metrics
from rul.models import build_model
from rul.preprocessing import Preprocessor, WindowSet
from rul.preprocessing.target import cap_rul
from rul.preprocessing.windows import short_units, warn_padded
from rul.training.batching import WindowBatches
from rul.training.checkpoint import Checkpointer
from rul.training.distributed import World, current_world
from rul.training.engine import TrainState, fit
from rul.training.evaluate import predict_windows
from rul.training.hardware import keep_freed_memory
from rul.training.listener import TrainingListener
from rul.training.memory import resolve_auto_split
from rul.training.precision import Precision, resolve_device, resolve_precision
from rul.training.seeding import Seeds, derive_seeds, seed_everything


@dataclass
class PreparedData:
    subset: CMAPSSSubset
    preprocessor: Preprocessor
    train_units: np.ndarray
    val_units: np.ndarray
    train: WindowSet
    val: WindowSet
    test: WindowSet  # last window of each test unit, target = capped true RUL
    test_units: np.ndarray


@dataclass
class TrainingOutcome:
    config: Config
    model: object
    data: PreparedData
    state: TrainState
    seeds: Seeds
    precision: Precision
    metrics: dict  # test metrics + best_epoch
    predictions: pd.DataFrame  # unit, true_rul, predicted_rul (+ its interval's bounds)
    model_uri: str | None = None  # set once the model is logged to MLflow
    interval: Interval | None = None  # calibrated on the validation windows; None: disabled


def preprocessor_for(config: Config) -> Preprocessor:
    return Preprocessor(
        features=config.features, include_settings=config.include_settings,
        include_cycle=config.include_cycle,
        drop_constant=config.drop_constant, normalization=config.normalization,
        n_conditions=config.n_conditions, smoothing_alpha=config.smoothing_alpha,
        window=config.window, rul_cap=config.rul_cap,
    )


def prepare_data(config: Config, seeds: Seeds | None = None,
                 subset: CMAPSSSubset | None = None) -> PreparedData:
    """Load, split by unit, fit the preprocessing on training units only, cut windows.

    Raises ConfigError when the window leaves a split without a single window, so that this
    is known before any training (or tracking) starts.
    """
    seeds = seeds or derive_seeds(config.seed)
    subset = subset or load_subset(config.subset, config.data_dir)
    train_units, val_units = split_units(subset.train["unit"], config.val_fraction, seeds.split)
    preprocessor = preprocessor_for(config).fit(rows_of(subset.train, train_units))
    data = _windows(config, subset, preprocessor, train_units, val_units)
    _check_calibration(config, len(data.val))
    return data


def prepare_folds(config: Config, seeds: Seeds | None = None,
                  subset: CMAPSSSubset | None = None) -> list[PreparedData]:
    """The data of each member of a cross-fitted ensemble (ensemble_split: folds): the
    training units in config.ensemble folds (seeds.split's permutation); member i validates on
    fold i and trains on the others. The preprocessing is fitted once on every training unit
    (the ensemble's training data; the test units never) and shared, so the members read the
    same scaled rows and the same test windows, and the model stores one preprocessor.
    Raises ConfigError like prepare_data."""
    seeds = seeds or derive_seeds(config.seed)
    subset = subset or load_subset(config.subset, config.data_dir)
    units = np.unique(subset.train["unit"])
    try:
        folds = fold_units(units, config.ensemble, seeds.split)
    except ValueError as error:
        raise ConfigError(f"ensemble={config.ensemble}: {error} (the training units of "
                          f"{subset.name})") from None
    preprocessor = preprocessor_for(config).fit(rows_of(subset.train, units))
    test = _test_windows(config, subset, preprocessor)
    members = [_windows(config, subset, preprocessor, np.setdiff1d(units, fold), fold, test)
               for fold in folds]
    _check_calibration(config, sum(len(m.val) for m in members), folds=True)
    return members


def prepare_members(config: Config, seeds: Seeds | None = None,
                    subset: CMAPSSSubset | None = None) -> list[PreparedData]:
    """Each ensemble member's data: one shared object (ensemble_split: shared) or its fold."""
    if config.ensemble_split == "folds":
        return prepare_folds(config, seeds, subset)
    return [prepare_data(config, seeds, subset)] * config.ensemble


def _windows(config: Config, subset: CMAPSSSubset, preprocessor: Preprocessor,
             train_units: np.ndarray, val_units: np.ndarray,
             test: tuple[np.ndarray, WindowSet] | None = None) -> PreparedData:
    train_rows, val_rows = rows_of(subset.train, train_units), rows_of(subset.train, val_units)
    train, val = preprocessor.window_set(train_rows), preprocessor.window_set(val_rows)
    for split, windows, rows in (("training", train, train_rows), ("validation", val, val_rows)):
        if len(windows) == 0:
            longest = int(rows.groupby("unit").size().max())
            raise ConfigError(
                f"window={config.window}: longer than every {split} unit of {subset.name} "
                f"(the longest has {longest} cycles), so there is nothing to train on"
            )
    test_units, test_windows = test or _test_windows(config, subset, preprocessor)
    return PreparedData(subset, preprocessor, train_units, val_units, train, val, test_windows,
                        test_units)


def _test_windows(config: Config, subset: CMAPSSSubset, preprocessor: Preprocessor
                  ) -> tuple[np.ndarray, WindowSet]:
    """The last window of each test unit, its target the capped true RUL; a unit shorter
    than the window is edge-padded, named in a PaddedUnitWarning and in `padded_units`."""
    test_units, windows = preprocessor.last_windows(subset.test)
    padded = short_units(subset.test["unit"].to_numpy(), config.window)
    warn_padded(padded, config.window)
    n, w, f = windows.shape
    return test_units, WindowSet(windows.reshape(n * w, f), np.arange(n) * w,
                                 cap_rul(subset.test_rul.astype(np.float32), config.rul_cap),
                                 test_units, w, padded_units=padded)


def _check_calibration(config: Config, n_windows: int, folds: bool = False) -> None:
    needed = min_calibration_size(config.interval_coverage) if config.interval_coverage else 0
    if n_windows < needed:
        raise ConfigError(f"interval_coverage={config.interval_coverage}: needs at least "
                          f"{needed} validation windows to calibrate, the validation units "
                          f"give {n_windows} (lower it"
                          f"{'' if folds else ', or raise val_fraction'})")


def run_training(config: Config, data: PreparedData | None = None,
                 listener: TrainingListener | None = None, checkpointer: Checkpointer | None = None,
                 resume_from: dict | None = None, progress: bool = True,
                 subset: CMAPSSSubset | None = None, world: World | None = None
                 ) -> TrainingOutcome:
    """Train `config` (on `data` if already prepared), evaluate on the test units.

    Under torchrun every rank calls this (rank 0 with the tracking listener and checkpointer,
    the others with neither); every rank resumes from rank 0's `resume_from`, and every rank
    evaluates the test units itself (identical numbers).
    """
    world = world or current_world()
    seeds = seed_everything(config.seed, config.deterministic)
    device = resolve_device(config.device)
    if device.type == "cpu":
        keep_freed_memory()  # no page faults per step (hardware.py; README: Speed)
    if world.distributed:
        resume_from = world.broadcast(resume_from)
    precision = resolve_precision(config.precision, device, config.model,
                                  resumed=(resume_from or {}).get("precision"))
    data = data or prepare_data(config, seeds, subset)
    config, _ = resolve_auto_split(config, data.preprocessor.n_features, data.train, precision)
    model = build_model(config, data.preprocessor.n_features).to(device)
    state = fit(model, config, precision, seeds, WindowBatches(data.train, device),
                WindowBatches(data.val, device), listener=listener, checkpointer=checkpointer,
                resume_from=resume_from, progress=progress, world=world)
    predicted = predict_windows(model, WindowBatches(data.test, device))
    test = rul_metrics(predicted, data.subset.test_rul, config.rul_cap)
    metrics = {**{f"test_{k}": v for k, v in test.items()},
               "best_epoch": state.best_epoch, "best_val_rmse": state.best_val_rmse}
    predictions = pd.DataFrame({"unit": data.test_units, "true_rul": data.subset.test_rul,
                                "true_rul_capped": data.test.targets, "predicted_rul": predicted})
    interval = None
    if config.interval_coverage is not None:
        validation = predict_windows(model, WindowBatches(data.val, device))
        residuals = np.asarray(validation, dtype=np.float64) - data.val.targets
        interval = add_interval(residuals, data, config, predictions, metrics)
    return TrainingOutcome(config, model, data, state, seeds, precision, metrics, predictions,
                           interval=interval)


def add_interval(residuals, data: PreparedData, config: Config,
                 predictions: pd.DataFrame, metrics: dict) -> Interval:
    """Calibrate the split conformal interval on the validation windows' `residuals`
    (predicted - capped target), add its bounds to the test `predictions` and its figures to
    `metrics`; return it.

    A served prediction reads the last window of a unit's history, truncated anywhere; the
    validation units run to failure, so each of their windows is one such truncation point,
    its target the capped RUL the model was trained on. The test units are never used to
    calibrate: their coverage and mean width are reported only.
    """
    interval = fit_conformal(residuals, config.interval_coverage)
    lower, upper = interval.bounds(predictions["predicted_rul"].to_numpy(), high=config.rul_cap)
    predictions["predicted_rul_lower"], predictions["predicted_rul_upper"] = lower, upper
    test = interval_scores(lower, upper, data.test.targets)
    metrics.update(interval_coverage_target=interval.coverage,
                   interval_half_width=interval.half_width,
                   test_interval_coverage=test["coverage"], test_interval_width=test["width"])
    return interval

"""One training experiment end to end: data -> preprocessing -> model -> fit -> test metrics.

Tracking plugs in through the engine's Callback; this module knows nothing about MLflow.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rul.config import TUNING_KEYS, Config
from rul.data import CMAPSSSubset, load_subset
from rul.data.split import rows_of, split_units
from rul.evaluation.metrics import rul_metrics
from rul.models import build_model
from rul.preprocessing import Preprocessor, WindowSet
from rul.training import checkpoint
from rul.training.batching import WindowBatches
from rul.training.engine import Callback, TrainState, fit, predict
from rul.training.precision import Precision, resolve_device, resolve_precision
from rul.training.seeding import Seeds, seed_everything

# Keys that do not change what is trained (so they do not change the checkpoint identity).
NON_TRAINING_KEYS = {"data_dir", "tracking_uri", "experiment", "register", "run_name",
                     "checkpoint_dir", "device", *TUNING_KEYS}


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
    predictions: pd.DataFrame  # unit, true_rul, predicted_rul
    model_uri: str | None = None  # set once the model is logged to MLflow


def preprocessor_for(config: Config) -> Preprocessor:
    return Preprocessor(
        features=config.features, include_settings=config.include_settings,
        drop_constant=config.drop_constant, normalization=config.normalization,
        n_conditions=config.n_conditions, smoothing_alpha=config.smoothing_alpha,
        window=config.window, rul_cap=config.rul_cap,
    )


def prepare_data(config: Config, seeds: Seeds, subset: CMAPSSSubset | None = None):
    subset = subset or load_subset(config.subset, config.data_dir)
    train_units, val_units = split_units(subset.train["unit"], config.val_fraction, seeds.split)
    train_rows, val_rows = rows_of(subset.train, train_units), rows_of(subset.train, val_units)
    preprocessor = preprocessor_for(config).fit(train_rows)  # training units only
    test_units, test_windows = preprocessor.last_windows(subset.test)
    n, w, f = test_windows.shape
    test = WindowSet(test_windows.reshape(n * w, f), np.arange(n) * w,
                     np.minimum(subset.test_rul, config.rul_cap).astype(np.float32),
                     test_units, w)
    return PreparedData(subset, preprocessor, train_units, val_units,
                        preprocessor.windows(train_rows), preprocessor.windows(val_rows),
                        test, test_units)


def checkpoint_path(config: Config) -> Path:
    """Where this configuration's run checkpoints (same training config -> same file)."""
    if config.run_name:
        key = config.run_name
    else:
        training = {k: v for k, v in config.to_dict().items() if k not in NON_TRAINING_KEYS}
        digest = hashlib.sha256(json.dumps(training, sort_keys=True).encode()).hexdigest()[:10]
        key = f"{config.subset.lower()}-{config.model}-{digest}"
    return Path(config.checkpoint_dir) / f"{key}.pt"


def run_training(config: Config, callback: Callback | None = None, resume_from: dict | None = None,
                 checkpoint_extra: dict | None = None, progress: bool = True,
                 subset: CMAPSSSubset | None = None, save_checkpoints: bool = True):
    seeds = seed_everything(config.seed, config.deterministic)
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    data = prepare_data(config, seeds, subset)
    model = build_model(config, data.preprocessor.n_features).to(device)
    state = fit(
        model, config, precision, seeds,
        WindowBatches(data.train, device), WindowBatches(data.val, device),
        callback=callback, resume_from=resume_from, progress=progress,
        checkpoint_path=checkpoint_path(config) if save_checkpoints else None,
        checkpoint_extra=checkpoint_extra,
    )
    predicted = predict(model, precision, WindowBatches(data.test, device))
    metrics = {**rul_metrics(predicted, data.subset.test_rul, config.rul_cap),
               "best_epoch": state.best_epoch, "best_val_rmse": state.best_val_rmse}
    predictions = pd.DataFrame({"unit": data.test_units, "true_rul": data.subset.test_rul,
                                "predicted_rul": predicted})
    return TrainingOutcome(config, model, data, state, seeds, precision, metrics, predictions)


def load_checkpoint(config: Config) -> dict:
    path = checkpoint_path(config)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume at {path} (same config and run_name?)")
    return checkpoint.load(path, resolve_device(config.device))

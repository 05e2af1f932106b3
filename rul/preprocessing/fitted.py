"""The fitted preprocessing as plain numbers, and THE transform that applies them.

Training's Preprocessor (pipeline.py, a scikit-learn estimator) learns these numbers and
transforms through `FittedPreprocessing.transform`; a logged model stores them in its
inference spec (JSON, no pickle) and the lean runtime (rul.serving.runtime) applies the same
code. Numpy and pandas only: the served model imports this module without scikit-learn.

A row's operating condition is the nearest condition centre (Euclidean distance over the data
set's settings, KMeans' own rule); each feature is mapped as x * scale[condition] +
offset[condition] in float64, rounded to float32; the engine's age (`cycle`, when the model
reads it) has one scaler whatever the condition; then each unit is smoothed causally
(smoothing.py).
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rul.data.schema import SETTING_COLUMNS
from rul.preprocessing.features import AGE
from rul.preprocessing.smoothing import smooth_per_unit
from rul.preprocessing.target import piecewise_rul
from rul.preprocessing.windows import (
    WindowSet,
    last_windows,
    short_units,
    warn_dropped,
    window_starts,
)


def nearest_condition(settings, centres) -> np.ndarray:
    """The operating condition of each row: the index of the nearest of `centres` (None or a
    single centre: condition 0 for every row)."""
    settings = np.asarray(settings, dtype=np.float64)
    if centres is None or len(centres) == 1:
        return np.zeros(len(settings), dtype=np.int64)
    centres = np.asarray(centres, dtype=np.float64)
    distances = ((settings[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2)
    return distances.argmin(axis=1).astype(np.int64)


def scale_by_condition(values, labels, scale, offset) -> np.ndarray:
    """values * scale[label] + offset[label] per row, in float64, as float32."""
    values = np.asarray(values, dtype=np.float64)
    return (values * scale[labels] + offset[labels]).astype(np.float32)


@dataclass(frozen=True, eq=False)
class FittedPreprocessing:
    """What the Preprocessor learned, as numbers a JSON document can hold."""

    feature_columns: list  # the network's inputs in order (AGE last when the model reads it)
    scale: np.ndarray  # (conditions, measured features): x * scale + offset
    offset: np.ndarray
    centres: np.ndarray | None  # (conditions, settings) of each condition; None: one
    smoothing_alpha: float
    window: int
    rul_cap: float
    age_scale: float | None = None  # the age's scaler (None: the model does not read it)
    age_offset: float | None = None
    settings: list = field(default_factory=lambda: list(SETTING_COLUMNS))  # what decides
    # a row's condition: the data set's setting columns (C-MAPSS's by default)

    @property
    def measured(self) -> list[str]:
        """The feature columns that are measurements (not the age)."""
        return [c for c in self.feature_columns if c != AGE]

    @property
    def n_features(self) -> int:
        return len(self.feature_columns)

    @property
    def n_conditions(self) -> int:
        return len(self.scale)

    def conditions(self, settings) -> np.ndarray:
        return nearest_condition(settings, self.centres)

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        """Rows (validated, each unit contiguous in cycle order) -> normalized, smoothed
        float32 features, one row per input row."""
        labels = self.conditions(frame[self.settings].to_numpy())
        scaled = scale_by_condition(frame[self.measured].to_numpy(), labels, self.scale,
                                    self.offset)
        if AGE in self.feature_columns:
            age = scale_by_condition(frame[[AGE]].to_numpy(), np.zeros(len(frame), np.int64),
                                     np.array([[self.age_scale]]),
                                     np.array([[self.age_offset]]))
            scaled = np.hstack([scaled, age])
        # smoothed after scaling: per-condition scaling is not one affine map over rows
        return smooth_per_unit(scaled, frame["unit"].to_numpy(), self.smoothing_alpha)

    def last_windows(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(unit ids, last window of each unit): the input for predicting RUL now."""
        return last_windows(self.transform(frame), frame["unit"].to_numpy(), self.window)

    def window_set(self, frame: pd.DataFrame, stacklevel: int = 3) -> WindowSet:
        """All full windows of each unit with their piecewise-linear RUL targets.

        A unit shorter than the window has no full window: it is dropped, recorded in
        `dropped_units` (unit -> rows) and named in a ShortUnitWarning that points at the
        caller (`stacklevel` frames up from the warning).
        """
        values = self.transform(frame)
        units = frame["unit"].to_numpy()
        starts = window_starts(units, self.window)
        rul = piecewise_rul(frame, self.rul_cap)
        end = starts + self.window - 1
        dropped = short_units(units, self.window)
        warn_dropped(dropped, self.window, stacklevel)
        return WindowSet(values, starts, rul[end], units[end], self.window, dropped)

    def to_dict(self) -> dict:
        values = {"feature_columns": list(self.feature_columns),
                  "scale": self.scale.tolist(), "offset": self.offset.tolist(),
                  "centres": None if self.centres is None else self.centres.tolist(),
                  "smoothing_alpha": float(self.smoothing_alpha), "window": int(self.window),
                  "rul_cap": float(self.rul_cap)}
        if AGE in self.feature_columns:
            values.update(age_scale=float(self.age_scale), age_offset=float(self.age_offset))
        if list(self.settings) != SETTING_COLUMNS:
            values["settings"] = list(self.settings)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> "FittedPreprocessing":
        """Read stored numbers; ValueError naming what is missing or inconsistent."""
        missing = [k for k in ("feature_columns", "scale", "offset", "smoothing_alpha",
                               "window", "rul_cap") if k not in values]
        if missing:
            raise ValueError(f"preprocessing lacks {missing}")
        scale = np.asarray(values["scale"], dtype=np.float64)
        offset = np.asarray(values["offset"], dtype=np.float64)
        centres = values.get("centres")
        centres = None if centres is None else np.asarray(centres, dtype=np.float64)
        columns = [str(c) for c in values["feature_columns"]]
        measured = len([c for c in columns if c != AGE])
        if scale.ndim != 2 or scale.shape != offset.shape or scale.shape[1] != measured:
            raise ValueError(f"preprocessing: scale {scale.shape} and offset {offset.shape} "
                             f"do not fit {measured} measured features")
        settings = [str(c) for c in values.get("settings", SETTING_COLUMNS)]
        if centres is not None and centres.shape != (len(scale), len(settings)):
            raise ValueError(f"preprocessing: centres {centres.shape} for {len(scale)} "
                             "conditions")
        if AGE in columns and not {"age_scale", "age_offset"} <= set(values):
            raise ValueError("preprocessing reads the age (cycle) but lacks its scaler")
        return cls(columns, scale, offset, centres, float(values["smoothing_alpha"]),
                   int(values["window"]), float(values["rul_cap"]),
                   values.get("age_scale"), values.get("age_offset"), settings)

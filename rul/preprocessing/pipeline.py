"""The whole preprocessing as one scikit-learn style estimator (fit on training units only)."""

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from rul.data.schema import SENSOR_COLUMNS, SETTING_COLUMNS
from rul.preprocessing.envelope import Envelope
from rul.preprocessing.features import AGE, candidate_columns, near_constant
from rul.preprocessing.fitted import FittedPreprocessing
from rul.preprocessing.scaling import ConditionScaler
from rul.preprocessing.windows import WindowSet


class Preprocessor(BaseEstimator):
    """Raw C-MAPSS rows -> normalized, smoothed features -> windows (+ RUL targets).

    fit(frame) learns the feature columns and the scaler from the given (training) rows;
    transform(frame) returns normalized float32 rows, each unit causally smoothed with
    `smoothing_alpha` (1 = off); windows(frame) and last_windows(frame) build model inputs.
    What it learned is `fitted()`, plain numbers (rul.preprocessing.fitted), and transform IS
    their transform: a logged model stores the numbers, and serving applies the same code.
    fit also records `envelope_`, the range of the training rows (rul.preprocessing.envelope).
    Picklable (models logged before the numbers were stored bundle the pickled object).
    """

    include_cycle = False  # what objects pickled before the parameter existed read
    settings = sensors = None  # and before data sets of their own: C-MAPSS's columns

    def __init__(self, features="informative", include_settings=False, include_cycle=False,
                 drop_constant=False,
                 constant_tolerance=1e-2, normalization="minmax", n_conditions=1,
                 smoothing_alpha=1.0, window=30, rul_cap=125, random_state=0,
                 settings=None, sensors=None):
        self.features = features
        self.include_settings = include_settings
        self.include_cycle = include_cycle
        self.drop_constant = drop_constant
        self.constant_tolerance = constant_tolerance
        self.normalization = normalization
        self.n_conditions = n_conditions
        self.smoothing_alpha = smoothing_alpha
        self.window = window
        self.rul_cap = rul_cap
        self.random_state = random_state
        self.settings = settings  # the data set's setting columns (None: C-MAPSS's)
        self.sensors = sensors  # its sensor columns (None: C-MAPSS's)

    @property
    def setting_columns(self) -> list[str]:
        return list(SETTING_COLUMNS if self.settings is None else self.settings)

    @property
    def sensor_columns(self) -> list[str]:
        return list(SENSOR_COLUMNS if self.sensors is None else self.sensors)

    def fit(self, frame: pd.DataFrame, y=None):
        columns = candidate_columns(self.features, self.include_settings, self.include_cycle,
                                    self.setting_columns, self.sensor_columns)
        self.scaler_ = ConditionScaler(self.normalization, self.n_conditions, self.random_state)
        settings = frame[self.setting_columns].to_numpy()
        if self.drop_constant:
            if self.n_conditions > 1:  # constancy is judged within each operating condition
                self.scaler_.fit(frame[columns].to_numpy(), settings)
            groups = self.scaler_.conditions(settings)
            dropped = set(near_constant(frame, columns, groups, self.constant_tolerance))
            columns = [c for c in columns if c not in dropped]
            if columns in ([], [AGE]):  # the age alone is no measurement of the engine
                raise ValueError("every feature column is near-constant on the training rows")
        self.feature_columns_ = columns
        self.scaler_.fit(frame[self._measured].to_numpy(), settings)
        if AGE in columns:  # the age does not depend on the operating condition: one scaler
            self.age_scaler_ = ConditionScaler(self.normalization).fit(
                frame[[AGE]].to_numpy(), settings)
        self.envelope_ = Envelope.fit(frame, self._measured, self.scaler_.conditions(settings),
                                      self.n_conditions, self.setting_columns,
                                      self.sensor_columns)
        return self

    @property
    def _measured(self) -> list[str]:
        return [c for c in self.feature_columns_ if c != AGE]

    def fitted(self) -> FittedPreprocessing:
        """The fitted numbers: feature columns, each condition's scale and offset, the
        conditions' centres, the age's scaler, smoothing alpha, window and rul_cap."""
        age = AGE in self.feature_columns_
        return FittedPreprocessing(
            list(self.feature_columns_), self.scaler_.scale_, self.scaler_.offset_,
            self.scaler_.centres, self.smoothing_alpha, self.window, self.rul_cap,
            float(self.age_scaler_.scale_[0, 0]) if age else None,
            float(self.age_scaler_.offset_[0, 0]) if age else None, self.setting_columns)

    def conditions(self, settings) -> np.ndarray:
        """Each row's operating condition (0 for every row with one condition)."""
        return self.scaler_.conditions(settings)

    def transform(self, frame: pd.DataFrame) -> np.ndarray:
        return self.fitted().transform(frame)

    @property
    def n_features(self) -> int:
        return len(self.feature_columns_)

    def window_set(self, frame: pd.DataFrame) -> WindowSet:
        """All full windows of each unit with their piecewise-linear RUL targets (see
        FittedPreprocessing.window_set)."""
        return self.fitted().window_set(frame, stacklevel=4)  # the warning names our caller

    def last_windows(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(unit ids, last window of each unit): the input for predicting RUL now."""
        return self.fitted().last_windows(frame)

"""Normalization, global or per operating condition, with scikit-learn scalers and KMeans."""

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.cluster import KMeans
from sklearn.preprocessing import MinMaxScaler, StandardScaler

from rul.preprocessing.fitted import nearest_condition, scale_by_condition


class ConditionScaler(TransformerMixin, BaseEstimator):
    """Scale features per operating condition.

    The conditions are found by KMeans on the three operational settings (FD002/FD004 have
    six); with `n_conditions=1` this is a plain global scaler. `method` is 'minmax' (to
    [-1, 1]) or 'zscore'. Each condition's scaler is an sklearn scaler fitted on that
    condition's rows; transform applies them as one vectorized affine map. A row's condition
    is its nearest KMeans centre, found by rul.preprocessing.fitted (the lean runtime's code).
    """

    def __init__(self, method: str = "minmax", n_conditions: int = 1, random_state: int = 0):
        self.method = method
        self.n_conditions = n_conditions
        self.random_state = random_state

    @property
    def centres(self) -> np.ndarray | None:
        """The conditions' centres in settings space (None: a single condition)."""
        return self.kmeans_.cluster_centers_ if self.n_conditions > 1 else None

    def conditions(self, settings: np.ndarray) -> np.ndarray:
        return nearest_condition(settings, self.centres)

    def fit(self, X, settings=None):
        X = np.asarray(X, dtype=np.float64)
        if self.method not in ("minmax", "zscore"):
            raise ValueError(f"normalization must be 'minmax' or 'zscore', got {self.method!r}")
        if self.n_conditions > 1:
            self.kmeans_ = KMeans(
                n_clusters=self.n_conditions, n_init=10, random_state=self.random_state
            ).fit(np.asarray(settings, dtype=np.float64))
        labels = self.conditions(settings)
        self.scale_ = np.ones((self.n_conditions, X.shape[1]))
        self.offset_ = np.zeros((self.n_conditions, X.shape[1]))
        for k in range(self.n_conditions):
            rows = X[labels == k]
            if len(rows) == 0:
                continue
            if self.method == "minmax":
                scaler = MinMaxScaler(feature_range=(-1, 1)).fit(rows)
                self.scale_[k], self.offset_[k] = scaler.scale_, scaler.min_
            else:
                scaler = StandardScaler().fit(rows)
                self.scale_[k] = 1.0 / scaler.scale_
                self.offset_[k] = -scaler.mean_ / scaler.scale_
        return self

    def transform(self, X, settings=None):
        return scale_by_condition(X, self.conditions(settings), self.scale_, self.offset_)

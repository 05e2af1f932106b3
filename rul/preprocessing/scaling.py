"""Normalization, global or per operating condition, with scikit-learn scalers and KMeans."""

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.cluster import KMeans
from sklearn.preprocessing import MinMaxScaler, StandardScaler


class ConditionScaler(TransformerMixin, BaseEstimator):
    """Scale features per operating condition.

    The conditions are found by KMeans on the three operational settings (FD002/FD004 have
    six); with `n_conditions=1` this is a plain global scaler. `method` is 'minmax' (to
    [-1, 1]) or 'zscore'. Each condition's scaler is an sklearn scaler fitted on that
    condition's rows; transform applies them as one vectorized affine map.
    """

    def __init__(self, method: str = "minmax", n_conditions: int = 1, random_state: int = 0):
        self.method = method
        self.n_conditions = n_conditions
        self.random_state = random_state

    def conditions(self, settings: np.ndarray) -> np.ndarray:
        if self.n_conditions == 1:
            return np.zeros(len(settings), dtype=np.int64)
        return self.kmeans_.predict(np.asarray(settings, dtype=np.float64))

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
        labels = self.conditions(settings)
        X = np.asarray(X, dtype=np.float64)
        return (X * self.scale_[labels] + self.offset_[labels]).astype(np.float32)

"""Causal exponential smoothing of each unit's normalized sensor trajectories.

C-MAPSS sensors carry measurement noise that is large next to the slow degradation trend; the
prediction for a unit rests on its last window, so that noise goes straight into the error.
Smoothing looks only backwards and only within a unit: a training window is smoothed exactly
as the same cycles would be in service, from the cycles seen so far.
"""

import numpy as np
import pandas as pd


def smooth_per_unit(values: np.ndarray, units: np.ndarray, alpha: float) -> np.ndarray:
    """Replace each row by the exponentially weighted mean of its unit's rows up to it.

    Row t of a unit becomes sum_k w_k x[t-k] / sum_k w_k, w_k = (1 - alpha)^k, k = 0..t
    (pandas' `ewm(alpha=alpha, adjust=True)`), so a unit's first row is kept as it is.
    alpha = 1 returns `values` unchanged. Rows of a unit must be contiguous and in cycle order,
    as the reader guarantees.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"smoothing alpha must be in (0, 1], got {alpha!r}")
    if alpha == 1 or len(values) == 0:
        return values
    smoothed = pd.DataFrame(values).groupby(units, sort=False).ewm(alpha=alpha).mean()
    return smoothed.droplevel(0).sort_index().to_numpy(dtype=values.dtype, copy=True)

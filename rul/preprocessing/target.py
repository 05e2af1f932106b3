"""Piecewise-linear RUL target: constant at `cap` early in life, then linear down to 0."""

import numpy as np
import pandas as pd


def cap_rul(rul, cap: float | None) -> np.ndarray:
    """The target's rule, in one place: RUL above `cap` counts as `cap` (None: no cap)."""
    rul = np.asarray(rul)
    if cap is None:
        return rul
    capped = np.minimum(rul, cap)
    return capped.astype(rul.dtype) if np.issubdtype(rul.dtype, np.floating) else capped


def piecewise_rul(frame: pd.DataFrame, cap: float | None = 125) -> np.ndarray:
    """RUL of each row = min(cap, last cycle of its unit - cycle), as float32."""
    last = frame.groupby("unit", sort=False)["cycle"].transform("max").to_numpy()
    rul = (last - frame["cycle"].to_numpy()).astype(np.float32)
    return cap_rul(rul, cap)

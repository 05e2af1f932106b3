"""Piecewise-linear RUL target: constant at `cap` early in life, then linear down to 0."""

import numpy as np
import pandas as pd


def piecewise_rul(frame: pd.DataFrame, cap: float | None = 125) -> np.ndarray:
    """RUL of each row = min(cap, last cycle of its unit - cycle), as float32."""
    last = frame.groupby("unit", sort=False)["cycle"].transform("max").to_numpy()
    rul = (last - frame["cycle"].to_numpy()).astype(np.float32)
    return rul if cap is None else np.minimum(rul, np.float32(cap))

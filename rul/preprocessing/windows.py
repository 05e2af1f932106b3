"""Sliding windows over per-unit sequences, without a Python loop over windows."""

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def all_windows(values: np.ndarray, window: int) -> np.ndarray:
    """Every window of `window` consecutive rows: a read-only view of shape (n-w+1, w, f)."""
    return sliding_window_view(values, window, axis=0).transpose(0, 2, 1)


@dataclass
class WindowSet:
    """Windows of one split: a view over the split's normalized rows plus window indices.

    Window i covers rows `starts[i] .. starts[i] + window - 1` of `values`, all of one unit,
    and its target is the RUL of its last row. Nothing is copied until a batch is drawn.
    """

    values: np.ndarray  # (n_rows, n_features) normalized rows, float32
    starts: np.ndarray  # (n_windows,) first row of each window
    targets: np.ndarray  # (n_windows,) float32
    units: np.ndarray  # (n_windows,) unit id of each window
    window: int

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def windows(self) -> np.ndarray:
        """All windows of the rows as a view; index it with `starts` to get this split's."""
        return all_windows(self.values, self.window)


def window_starts(units: np.ndarray, window: int) -> np.ndarray:
    """Rows where a full window of one unit starts (units must be contiguous)."""
    if len(units) < window:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(units[: len(units) - window + 1] == units[window - 1 :])


def last_windows(values: np.ndarray, units: np.ndarray, window: int):
    """The last `window` rows of each unit, shape (n_units, w, f).

    Units shorter than the window are front-padded by repeating their first row (edge
    padding: the engine is assumed to have looked like its first observation before it).
    """
    boundaries = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
    firsts = boundaries
    lasts = np.r_[boundaries[1:], len(units)] - 1
    index = lasts[:, None] - np.arange(window - 1, -1, -1)[None, :]
    index = np.maximum(index, firsts[:, None])
    return units[firsts], values[index]

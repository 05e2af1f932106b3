"""Sliding windows over per-unit sequences, without a Python loop over windows."""

import warnings
from dataclasses import dataclass, field

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
    # units shorter than the window, left out (no full window): unit id -> its row count
    dropped_units: dict[int, int] = field(default_factory=dict)
    # units shorter than the window, edge-padded to one window (test): unit id -> row count
    padded_units: dict[int, int] = field(default_factory=dict)
    # (n_windows,) a target's upper end where it is a range (an engine in service,
    # rul.preprocessing.censored): `targets` is then its lower end; None: every target known
    upper: np.ndarray | None = None

    @property
    def windows_lost(self) -> int:
        """Targets the dropped units would have given: one per row (edge padding's windows)."""
        return sum(self.dropped_units.values())

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def windows(self) -> np.ndarray:
        """All windows of the rows as a view; index it with `starts` to get this split's."""
        return all_windows(self.values, self.window)

    def spread(self, count: int) -> np.ndarray:
        """`count` of this split's windows (all of them when fewer), evenly spread over it:
        (count, window, features)."""
        index = np.linspace(0, len(self) - 1, min(count, len(self))).round().astype(int)
        return self.windows[self.starts[index]]


class ShortUnitWarning(UserWarning):
    """Training rows of a unit shorter than the window were dropped (it has no full window)."""


class PaddedUnitWarning(UserWarning):
    """A test unit shorter than the window was edge-padded to one window for the metrics."""


def unit_lengths(units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unit ids, row counts) of contiguous unit blocks, in order of appearance."""
    boundaries = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
    return units[boundaries], np.diff(np.r_[boundaries, len(units)])


def short_units(units: np.ndarray, window: int) -> dict[int, int]:
    """Units with fewer rows than `window`: unit id -> row count."""
    if len(units) == 0:
        return {}
    ids, lengths = unit_lengths(units)
    return {int(u): int(n) for u, n in zip(ids, lengths) if n < window}


def _listed(units: dict[int, int], named: int = 5) -> str:
    """`unit 3 (22 rows), ...`: the first `named` units, then how many more."""
    shown = ", ".join(f"unit {u} ({n} rows)" for u, n in list(units.items())[:named])
    return shown + (f" and {len(units) - named} more" if len(units) > named else "")


def warn_dropped(dropped: dict[int, int], window: int, stacklevel: int = 3) -> None:
    """A ShortUnitWarning naming the dropped units; `stacklevel` 3 points at the caller of
    the function that calls this."""
    if dropped:
        listed = _listed(dropped)
        warnings.warn(ShortUnitWarning(
            f"dropped {len(dropped)} unit(s) shorter than the window ({window} cycles): "
            f"{listed}; {sum(dropped.values())} windows lost (one per row)"
        ), stacklevel=stacklevel)


def warn_padded(padded: dict[int, int], window: int) -> None:
    if padded:
        listed = _listed(padded)
        warnings.warn(PaddedUnitWarning(
            f"padded {len(padded)} test unit(s) shorter than the window ({window} cycles) to "
            f"one window by repeating their first row: {listed}; their predictions count in "
            "the test metrics"
        ), stacklevel=3)


def window_starts(units: np.ndarray, window: int) -> np.ndarray:
    """Rows where a full window of one unit starts (units must be contiguous)."""
    if len(units) < window:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(units[: len(units) - window + 1] == units[window - 1 :])


def last_windows(values: np.ndarray, units: np.ndarray, window: int):
    """The last `window` rows of each unit, shape (n_units, w, f).

    Units shorter than the window are front-padded by repeating their first row (edge
    padding: the engine is assumed to have looked like its first observation before it);
    inference reports them with `padded` = True.
    """
    boundaries = np.flatnonzero(np.r_[True, units[1:] != units[:-1]])
    firsts = boundaries
    lasts = np.r_[boundaries[1:], len(units)] - 1
    index = lasts[:, None] - np.arange(window - 1, -1, -1)[None, :]
    index = np.maximum(index, firsts[:, None])
    return units[firsts], values[index]

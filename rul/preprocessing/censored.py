"""What the training engines still in service (right-censored) teach, as `censored_training`
says: seen up to cycle T, an engine's RUL at cycle t is more than T - t, so the target of its
window ending at t, min(RUL, cap), lies in [min(T - t, cap), cap] (the window's `targets` are
that lower bound: the piecewise-linear target of a record that ends at T).

- known: only the windows whose target that makes known, where T - t reaches the cap;
- lower_bound: every window, its target the range [min(T - t, cap), cap] (`upper`), which the
  loss reads as a range (rul.training.step.rul_loss): nothing between the bounds is wrong;
- dropped: the engines do not train.

They never validate, are never held out for the test and never calibrate an interval.
"""

import numpy as np

from rul.preprocessing.windows import WindowSet

CHOICES = ("known", "lower_bound", "dropped")  # the config key's values, in one place


def trained_units(units: np.ndarray, censored, how: str) -> np.ndarray:
    """The training units: `units` (engines that failed) with the censored ones, unless
    `how` drops them."""
    if not censored or how == "dropped":
        return units
    return np.union1d(units, np.asarray(censored, units.dtype))


def training_windows(windows: WindowSet, censored, cap: float, how: str) -> WindowSet:
    """The training `windows` as `how` trains the `censored` engines' (see the module)."""
    if not censored or how == "dropped":
        return windows
    in_service = np.isin(windows.units, np.asarray(censored))
    if how == "lower_bound":
        upper = np.where(in_service, np.float32(cap), windows.targets).astype(np.float32)
        return _with(windows, np.ones(len(windows), bool), upper)
    if how == "known":
        return _with(windows, ~in_service | (windows.targets >= cap))
    raise ValueError(f"censored_training must be one of {', '.join(CHOICES)}, got {how!r}")


def _with(windows: WindowSet, keep: np.ndarray, upper: np.ndarray | None = None) -> WindowSet:
    return WindowSet(windows.values, windows.starts[keep], windows.targets[keep],
                     windows.units[keep], windows.window, windows.dropped_units,
                     windows.padded_units, upper=None if upper is None else upper[keep])

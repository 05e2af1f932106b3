"""Validation split by engine unit (never by window: windows of one engine overlap)."""

import numpy as np
import pandas as pd


def split_units(units, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle the distinct unit ids with a seeded RNG and split off `val_fraction` of them."""
    units = np.unique(np.asarray(units))
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = int(round(len(units) * val_fraction))
    if val_fraction > 0 and (n_val == 0 or n_val == len(units)):
        raise ValueError(f"cannot split {len(units)} units with val_fraction={val_fraction}")
    shuffled = _permuted(units, seed)
    return np.sort(shuffled[n_val:]), np.sort(shuffled[:n_val])


def rows_of(frame: pd.DataFrame, units: np.ndarray) -> pd.DataFrame:
    return frame[frame["unit"].isin(units)]


def fold_units(units, n_folds: int, seed: int) -> list[np.ndarray]:
    """The distinct unit ids in `n_folds` folds (sizes differing by at most one), each sorted:
    a seeded permutation cut in order, so fold i is the same for a seed whatever else changes."""
    units = np.unique(np.asarray(units))
    if not 2 <= n_folds <= len(units):
        raise ValueError(f"cannot cut {len(units)} units into {n_folds} folds")
    return [np.sort(fold) for fold in np.array_split(_permuted(units, seed), n_folds)]


def _permuted(units: np.ndarray, seed: int) -> np.ndarray:
    """The seed's order of the units: a validation split and folds of one seed agree on it."""
    return np.random.default_rng(seed).permutation(units)

"""A test set made from a table of run-to-failure histories, as NASA made C-MAPSS's: a share of
the engines held out (a seeded draw, the same whatever the run's seed), each history cut off
at a life fraction drawn uniform in LIFE_FRACTION, its true RUL the cycles that were left.

NASA's FD001 test units end at a life fraction t / (t + RUL) spread about evenly between 0.2
and 0.97 (rul.evaluation.truncation calibrates the interval on the same law). Engines that
have not failed (right-censored) have no RUL to score and are never held out.
"""

import numpy as np
import pandas as pd

LIFE_FRACTION = (0.2, 0.97)  # where NASA's FD001 test records end, as a share of the life


def hold_out(rows: pd.DataFrame, fraction: float, seed: int, keep=()
             ) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """(the rows of the engines left for training; the held-out engines' histories, each cut
    off after t = round(f x its rows) rows, f drawn uniform in LIFE_FRACTION; their true RUL:
    the cycles from the cut to the engine's last). `rows` as rul holds them (units
    contiguous); `keep`: units never held out (censored). ValueError for too few engines."""
    units = pd.unique(rows["unit"])
    eligible = np.setdiff1d(units, np.asarray(list(keep), dtype=units.dtype))
    n = int(round(len(eligible) * fraction))
    if n < 1 or len(units) - n < 2:
        raise ValueError(f"{len(eligible)} engines that failed cannot give a test share of "
                         f"{fraction:g} and leave two or more to train on")
    rng = np.random.default_rng(seed)
    held = np.sort(rng.permutation(eligible)[:n])
    fractions = rng.uniform(*LIFE_FRACTION, size=n)
    histories = dict(tuple(rows[rows["unit"].isin(held)].groupby("unit", sort=False)))
    parts, rul = [], []
    for unit, f in zip(held, fractions, strict=True):
        history = histories[unit]
        t = int(np.clip(np.rint(f * len(history)), 1, len(history) - 1))
        parts.append(history.iloc[:t])
        rul.append(int(history["cycle"].iloc[-1] - history["cycle"].iloc[t - 1]))
    return (rows[~rows["unit"].isin(held)].reset_index(drop=True),
            pd.concat(parts, ignore_index=True), np.asarray(rul, dtype=np.int64))

"""What the engine's age is worth, and what it costs when the counter is not what training saw.

- `AgeOnly`: the baseline that uses nothing but the age: at age a, the mean capped RUL
  min(L - a, cap) of the training engines still running at a (life L >= a); 0 past the
  longest life. A model with the age as an input should beat it by a wide margin.
- `SCENARIOS` and `perturbed`: the test records as recorded, with the counter offset
  (+25, +50 cycles), and starting late (25, 50 cycles, renumbered from 1: rul.data.records).
  A late start drops the units with no rows left; each scenario is scored with the same
  model on the units it keeps, beside the same units as recorded.
- `errors_by_age`: RMSE per bucket of the age at the last cycle.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.data.records import offset_counter, start_late
from rul.evaluation.metrics import rmse
from rul.preprocessing.target import cap_rul

SCENARIOS = {  # name -> the test rows under it, and the units it drops
    "as recorded": lambda rows: (rows, []),
    "counter +25": lambda rows: (offset_counter(rows, 25), []),
    "counter +50": lambda rows: (offset_counter(rows, 50), []),
    "starts 25 late": lambda rows: start_late(rows, 25),
    "starts 50 late": lambda rows: start_late(rows, 50),
}
AGE_BUCKETS = (0, 50, 100, 150, 200, np.inf)  # cycles recorded at the last row


def perturbed(rows: pd.DataFrame, scenario: str) -> tuple[pd.DataFrame, list[int]]:
    """(the test rows under `scenario`, units it drops)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[scenario](rows)


@dataclass(frozen=True)
class AgeOnly:
    """RUL from the age alone, fitted on the training engines' lives."""

    lives: np.ndarray  # each training engine's last cycle
    cap: float

    @classmethod
    def fit(cls, train_rows: pd.DataFrame, cap: float) -> "AgeOnly":
        return cls(train_rows.groupby("unit")["cycle"].max().to_numpy(np.float64), float(cap))

    def predict(self, ages) -> np.ndarray:
        ages = np.asarray(ages, dtype=np.float64)
        running = self.lives[None, :] >= ages[:, None]
        remaining = cap_rul(self.lives[None, :] - ages[:, None], self.cap)
        count = running.sum(axis=1)
        total = np.where(running, remaining, 0.0).sum(axis=1)
        return np.divide(total, count, out=np.zeros(len(ages)), where=count > 0)


def last_ages(rows: pd.DataFrame) -> pd.Series:
    """Each unit's counter at its last row (the age the model reads), by unit."""
    return rows.groupby("unit", sort=False)["cycle"].max()


def errors_by_age(predicted, true_capped, ages, buckets=AGE_BUCKETS) -> list[dict]:
    """RMSE, mean error (predicted - true) and unit count per age bucket [low, high)."""
    predicted, true_capped, ages = (np.asarray(a, dtype=np.float64)
                                    for a in (predicted, true_capped, ages))
    rows = []
    for low, high in zip(buckets[:-1], buckets[1:]):
        inside = (ages >= low) & (ages < high)
        if inside.any():
            rows.append({"ages": f"{low:g}-{high - 1:g}" if np.isfinite(high) else f">= {low:g}",
                         "units": int(inside.sum()),
                         "rmse": rmse(predicted[inside], true_capped[inside]),
                         "bias": float(np.mean(predicted[inside] - true_capped[inside]))})
    return rows

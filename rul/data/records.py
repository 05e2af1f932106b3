"""Records that bend what the engine's age assumes: that `cycle` counts from 1, the first cycle
of the engine's life.

- `offset_counter(rows, k)`: the counter runs k cycles ahead (it reads t + k at cycle t);
  the rows themselves are unchanged.
- `start_late(rows, k)`: the record starts k cycles into the engine's life (after wear nobody
  recorded) and is numbered from 1: each unit loses its first k rows and its cycles are
  renumbered 1, 2, ...; its last rows, hence its RUL, are unchanged. `k` is one number for
  every unit or a mapping unit -> k. A unit with no more than k rows has no record left and is
  dropped (the second value returned names them).

`late_starts(units, most, seed)` draws one late start per unit, uniform in 0..most, for
training with records that start after unknown wear (config key `late_start_max`).
"""

from collections.abc import Mapping

import numpy as np
import pandas as pd


def offset_counter(rows: pd.DataFrame, cycles: int) -> pd.DataFrame:
    """`rows` with every unit's cycle counter `cycles` ahead."""
    shifted = rows.copy()
    shifted["cycle"] = shifted["cycle"] + cycles
    return shifted


def start_late(rows: pd.DataFrame, cycles: int | Mapping[int, int]
               ) -> tuple[pd.DataFrame, list[int]]:
    """(each unit's record from its (k+1)-th row on, renumbered from 1; the units dropped
    because they had no more than k rows). Units keep their order."""
    units = rows["unit"].to_numpy()
    if isinstance(cycles, Mapping):
        late = np.array([cycles.get(int(u), 0) for u in units], dtype=np.int64)
    else:
        late = np.full(len(units), int(cycles), dtype=np.int64)
    if (late < 0).any():
        raise ValueError("a record cannot start before the engine's first cycle (late < 0)")
    position = rows.groupby("unit", sort=False).cumcount().to_numpy()  # 0 for the first row
    keep = position >= late
    kept = rows[keep].copy()
    kept["cycle"] = (position[keep] - late[keep] + 1).astype(rows["cycle"].dtype)
    dropped = sorted(set(units.tolist()) - set(units[keep].tolist()), key=units.tolist().index)
    return kept, [int(u) for u in dropped]


def late_starts(units, most: int, seed: int) -> dict[int, int]:
    """A late start for each unit, uniform in 0..most, from a generator seeded by `seed`."""
    units = np.unique(np.asarray(units))
    drawn = np.random.default_rng(seed).integers(0, most + 1, size=len(units))
    return {int(u): int(k) for u, k in zip(units, drawn)}

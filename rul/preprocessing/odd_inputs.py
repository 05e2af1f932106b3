"""Odd inputs: rows that are valid C-MAPSS but unlike what a model should learn from or be asked
about, and one policy for them, the same in training and in serving. POLICY is the table the
docs show (docs/hooks.py generates it); `find_odd` finds the kinds training acts on.

Serving judges a request against the training fleet's envelope (rul.preprocessing.envelope);
training judges the training engines against each other, since they are the fleet.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.data.schema import SENSOR_COLUMNS
from rul.preprocessing.windows import unit_lengths

FAR_SPREADS = 20.0  # robust standard deviations (1.4826 MAD) from a column's median
# A sensor the model does not read "varies" in training when its relative spread exceeds
# this; a served engine's unread sensor is flagged only when it lies beyond the fleet's range
# by more than 4 x this fraction of its value (rul.preprocessing.envelope): one threshold.
VARYING = 1e-3
NAMED = 5  # units a warning names, then counts


@dataclass(frozen=True)
class OddKind:
    key: str  # the run's tag is data.odd.<key>
    found: str  # when a unit has it
    training: str  # what `rul train` does
    serving: str  # what a served model does


POLICY = (
    OddKind("gaps", "two rows of a unit more than one cycle apart",
            "warns once, naming the units; tag `data.odd.gaps`; `strict_data` refuses",
            "flags the engine (`N cycles missing`); `strict` refuses"),
    OddKind("repeated_cycles", "a cycle that does not follow the one before it",
            "refuses the file (one line: file, line)", "refuses the request (one line: row)"),
    OddKind("late_start", "a unit's first cycle after cycle 1",
            "warns once, naming the units; tag `data.odd.late_start`; `strict_data` refuses",
            "flags the engine (`history starts at cycle N`); `strict` refuses"),
    OddKind("far_values", f"a value more than {FAR_SPREADS:g} robust standard deviations from "
            "its column's median in the training rows of its operating condition",
            "warns once, naming the units; tag `data.odd.far_values`; `strict_data` refuses",
            "flags the engine when a value lies more than 4 training standard deviations "
            "beyond the fleet's range, and widens its interval to [0, rul_cap]; `strict` "
            "refuses"),
    OddKind("varying_unread", "a sensor the model does not read varies (relative spread over "
            f"{VARYING:g}; FD001's constant sensors do not)",
            "warns once, naming the sensors; tag `data.odd.varying_unread`",
            "flags the engine when a sensor it does not read lies beyond the fleet's range by "
            f"more than 4 x (its training sd or {VARYING:.1%} of its value, the larger): a "
            "broken feed; the answer is unchanged; `strict` refuses"),
    OddKind("varying_in_test", "a sensor the model reads is constant in the training rows "
            f"(relative spread under {VARYING:g}) but varies in the test file",
            "warns once, naming the sensors (the model learned nothing from them, and their "
            "test values are scaled far out of range); tag `data.odd.varying_in_test`",
            "flags the engine when the value lies beyond the fleet's range, as any sensor "
            "it reads; `strict` refuses"),
)
KINDS = {kind.key: kind for kind in POLICY}


def relative_spread(values: np.ndarray, labels: np.ndarray) -> float:
    """A column's largest standard deviation within an operating condition, relative to its
    mean (at least 1): what "varies" means for a sensor."""
    return max(float(np.std(values[labels == k])) / max(1.0, abs(float(np.mean(
        values[labels == k])))) for k in np.unique(labels))


def varying_in_test(train: pd.DataFrame, train_labels: np.ndarray, test: pd.DataFrame,
                    test_labels: np.ndarray, read: list[str], sensors=SENSOR_COLUMNS
                    ) -> list[str]:
    """The sensors the model reads that are constant in the training rows but vary in the
    test rows (`sensors`: the data set's)."""
    return [c for c in read if c in sensors
            and relative_spread(train[c].to_numpy(np.float64), train_labels) <= VARYING
            < relative_spread(test[c].to_numpy(np.float64), test_labels)]


def find_odd(rows: pd.DataFrame, labels: np.ndarray, read: list[str], sensors=SENSOR_COLUMNS
             ) -> dict[str, list]:
    """The units (for `varying_unread`: the sensors) of validated training `rows` with each
    kind training acts on; `labels`: each row's operating condition; `read`: the columns the
    model reads; `sensors`: the data set's. Kinds without any are left out."""
    units, lengths = unit_lengths(rows["unit"].to_numpy())
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    cycles = rows["cycle"].to_numpy()
    steps = np.r_[0, np.diff(cycles)]
    steps[starts] = 1
    unit_of_row = np.repeat(units, lengths)
    found = {"gaps": sorted({int(u) for u in unit_of_row[steps > 1]}),
             "late_start": [int(u) for u, s in zip(units, starts, strict=True)
                            if cycles[s] > 1]}
    measured = [c for c in read if c in sensors]
    far = np.zeros(len(rows), bool)
    labels = np.asarray(labels)
    for condition in np.unique(labels):
        mine = labels == condition
        values = rows.loc[mine, measured].to_numpy(np.float64)
        median = np.median(values, axis=0)
        spread = 1.4826 * np.median(np.abs(values - median), axis=0)
        spread = np.maximum(spread, 1e-6 * np.maximum(1.0, np.abs(median)))
        far[mine] = (np.abs(values - median) > FAR_SPREADS * spread).any(axis=1)
    found["far_values"] = sorted({int(u) for u in unit_of_row[far]})
    unread = [c for c in sensors if c not in read]
    varying = []
    for column in unread:
        if relative_spread(rows[column].to_numpy(np.float64), labels) > VARYING:
            varying.append(column)
    found["varying_unread"] = varying
    return {key: value for key, value in found.items() if value}


def named(items: list) -> str:
    """The first NAMED items, then how many more."""
    shown = ", ".join(str(i) for i in items[:NAMED])
    return shown + (f" and {len(items) - NAMED} more" if len(items) > NAMED else "")


def describe(key: str, items: list) -> str:
    """One line for a kind found in training data."""
    if key == "varying_unread":
        return (f"training data: {named(items)} vary, but the model does not read them "
                "(features: the fixed list of informative sensors)")
    if key == "varying_in_test":
        return (f"test data: {named(items)} vary, but not in the training rows: the model "
                "learned nothing from them and their test values are scaled far out of "
                "range (drop them from features, or drop_constant: true)")
    return f"training data: {KINDS[key].found} in units {named(items)}"

"""The envelope of the training fleet, and which units of a request lie outside it.

Fitted on the training units' rows and stored with the model as plain numbers: per operating
condition the range and standard deviation of every measured feature, the settings and the
unread sensors; the largest cycle step and the latest first cycle. A unit is flagged, with a
short reason, when the rows its prediction reads (its whole history when the model smooths,
else its last window) hold a feature or the settings more than `sd_limit` training standard
deviations out, gaps, a late start or a short history, or an unread sensor far beyond its
range (UNREAD_FLOOR: a broken feed, flagged without effect on the answer; an unread sensor a
request leaves out is not checked) (docs: Predict and
serve, Inputs outside the training fleet). Numpy and pandas only: the lean runtime imports it.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.data.schema import SENSOR_COLUMNS, SETTING_COLUMNS
from rul.preprocessing.odd_inputs import VARYING
from rul.preprocessing.windows import unit_lengths

SD_LIMIT = 4.0  # training standard deviations beyond the training range that flag a value
_RELATIVE_FLOOR = 1e-6  # a constant column's spread: this fraction of its magnitude
# An unread sensor's spread: at least this fraction of its magnitude (noise on a constant sensor
# is no reason to flag an engine, a broken feed is): the odd-input policy's threshold VARYING.
UNREAD_FLOOR = VARYING
ROWS_AT_ONCE = 32_768  # rows checked at once: a request's memory stays a few MB over its rows


def _spread_floor(spread: np.ndarray, low: np.ndarray, high: np.ndarray,
                  relative: float = _RELATIVE_FLOOR) -> np.ndarray:
    magnitude = np.maximum(1.0, np.maximum(np.abs(low), np.abs(high)))
    return np.maximum(np.nan_to_num(spread), relative * np.nan_to_num(magnitude, nan=1.0))


def _excess(values: np.ndarray, low: np.ndarray, high: np.ndarray, spread: np.ndarray,
            relative: float = _RELATIVE_FLOOR) -> np.ndarray:
    """How far each value lies beyond [low, high], in units of spread (0 inside); a
    condition without training rows (nan bounds) is infinitely far."""
    beyond = np.maximum(np.maximum(low - values, values - high), 0.0)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(beyond), np.inf,
                        beyond / _spread_floor(spread, low, high, relative))


def _worst(rows: pd.DataFrame, columns: list, labels: np.ndarray, ranges: tuple,
           relative: float = _RELATIVE_FLOOR):
    """Each row's largest excess over `columns` against `ranges` (the training (low, high,
    spread) per condition) and the first column it is in, ROWS_AT_ONCE rows at a time."""
    low, high, spread = ranges
    worst = np.zeros(len(rows))
    column = np.zeros(len(rows), np.int64)
    if not len(columns):  # a data set without settings: nothing lies beyond
        return worst, column
    for start in range(0, len(rows), ROWS_AT_ONCE):
        part = slice(start, start + ROWS_AT_ONCE)
        at = labels[part]
        excess = _excess(rows.iloc[part][columns].to_numpy(np.float64), low[at], high[at],
                         spread[at], relative)
        worst[part], column[part] = excess.max(axis=1), excess.argmax(axis=1)
    return worst, column


def _stats(values: np.ndarray, labels: np.ndarray, n_conditions: int):
    shape = (n_conditions, values.shape[1])
    low, high, spread = (np.full(shape, np.nan) for _ in range(3))
    for k in range(n_conditions):
        rows = values[labels == k]
        if len(rows):
            low[k], high[k], spread[k] = rows.min(axis=0), rows.max(axis=0), rows.std(axis=0)
    return low, high, spread


@dataclass(frozen=True, eq=False)
class Envelope:
    columns: list  # the measured features checked (the model's inputs less the age)
    low: np.ndarray  # (conditions, columns) training minimum per condition
    high: np.ndarray
    spread: np.ndarray  # training standard deviation per condition
    settings_low: np.ndarray  # (conditions, settings)
    settings_high: np.ndarray
    settings_spread: np.ndarray
    max_cycle_step: int = 1  # largest step between consecutive cycles of a training unit
    max_first_cycle: int = 1  # latest first cycle of a training unit
    sd_limit: float = SD_LIMIT
    unread: tuple = ()  # the sensors the model does not read, checked all the same
    unread_low: np.ndarray | None = None  # (conditions, unread)
    unread_high: np.ndarray | None = None
    unread_spread: np.ndarray | None = None
    settings: tuple = tuple(SETTING_COLUMNS)  # the data set's setting columns

    @classmethod
    def fit(cls, frame: pd.DataFrame, columns: list[str], labels: np.ndarray,
            n_conditions: int, settings=SETTING_COLUMNS, sensors=SENSOR_COLUMNS) -> "Envelope":
        """The envelope of validated training rows `frame`, their conditions `labels`
        (0..n_conditions-1) and measured feature `columns`, given `settings` and `sensors`."""
        labels = np.asarray(labels)
        low, high, spread = _stats(frame[columns].to_numpy(np.float64), labels, n_conditions)
        s_low, s_high, s_spread = _stats(frame[list(settings)].to_numpy(np.float64), labels,
                                         n_conditions)
        units, cycles = frame["unit"].to_numpy(), frame["cycle"].to_numpy()
        same = units[1:] == units[:-1]
        steps = np.diff(cycles)[same]
        firsts = cycles[np.r_[True, ~same]]
        unread = tuple(c for c in sensors if c not in columns)
        u_low, u_high, u_spread = _stats(frame[list(unread)].to_numpy(np.float64), labels,
                                         n_conditions)
        return cls(list(columns), low, high, spread, s_low, s_high, s_spread,
                   int(steps.max()) if len(steps) else 1, int(firsts.max()), SD_LIMIT,
                   unread, u_low, u_high, u_spread, tuple(settings))

    def check(self, rows: pd.DataFrame, labels: np.ndarray, window: int,
              whole_history: bool) -> tuple[np.ndarray, list[str], np.ndarray]:
        """(flagged, reason, beyond) of each unit of validated `rows`, in order of appearance
        (reason '' inside the envelope; `beyond`: a value or the settings past the fleet's
        range); `labels`: each row's condition; `whole_history`: every row of a unit counts
        (the model smooths), else its last `window` rows."""
        labels = np.asarray(labels)
        ids, lengths = unit_lengths(rows["unit"].to_numpy())
        starts = np.r_[0, np.cumsum(lengths)[:-1]]
        from_end = np.repeat(starts + lengths, lengths) - np.arange(len(rows))  # 1 = last row
        read = np.ones(len(rows), bool) if whole_history else from_end <= window
        worst = self._worst_rows(rows, labels, read, starts)
        reasons, beyond = [], []
        for start, length in zip(starts, lengths):
            found = self._reasons(worst, slice(start, start + length), length, window)
            reasons.append("; ".join(found))
            part = slice(start, start + length)
            beyond.append(max(worst["settings"][part].max(), worst["sensor"][part].max())
                          > self.sd_limit)
        return np.array([bool(r) for r in reasons], dtype=bool), reasons, np.array(beyond, bool)

    def _worst_rows(self, rows: pd.DataFrame, labels: np.ndarray, read: np.ndarray,
                    starts: np.ndarray) -> dict:
        """Each row's worst excess (0 where not `read`) and its column, of the measured features,
        the settings and the unread sensors; its cycles and the cycles missing before it."""
        cycles = rows["cycle"].to_numpy()
        sensor, sensor_column = _worst(rows, self.columns, labels,
                                       (self.low, self.high, self.spread))
        settings, _ = _worst(rows, list(self.settings), labels,
                             (self.settings_low, self.settings_high, self.settings_spread))
        steps = np.r_[0, np.diff(cycles)]
        steps[starts] = 0  # a unit's first row follows no cycle of its own
        unread, unread_column = np.zeros(len(rows)), np.zeros(len(rows), np.int64)
        given = [i for i, c in enumerate(self.unread) if c in rows.columns]  # may be left out
        if given:
            unread, unread_column = _worst(
                rows, [self.unread[i] for i in given], labels,
                tuple(r[:, given] for r in (self.unread_low, self.unread_high,
                                            self.unread_spread)), UNREAD_FLOOR)
            unread_column = np.asarray(given)[unread_column]  # back to self.unread's order
        return {"cycles": cycles, "sensor_value": sensor, "sensor_column": sensor_column,
                "sensor": np.where(read, sensor, 0.0),
                "settings": np.where(read, settings, 0.0),
                "unread_value": unread, "unread_column": unread_column,
                "unread": np.where(read, unread, 0.0),
                "missing": np.where(read & (steps > self.max_cycle_step), steps - 1, 0)}

    def _reasons(self, worst: dict, part: slice, length: int, window: int) -> list[str]:
        """Why the unit of rows `part` lies outside the fleet (none: inside)."""
        cycles, found, start = worst["cycles"], [], part.start
        if length < window:
            found.append(f"{length}-row history, shorter than the window ({window})")
        if cycles[start] > self.max_first_cycle:
            found.append(f"history starts at cycle {cycles[start]}")
        if worst["missing"][part].sum():
            found.append(f"{worst['missing'][part].sum()} cycles missing")
        if worst["settings"][part].max() > self.sd_limit:
            row = start + int(worst["settings"][part].argmax())
            found.append(f"settings unlike the training conditions (cycle {cycles[row]})")
        if worst["sensor"][part].max() > self.sd_limit:
            row = start + int(worst["sensor"][part].argmax())
            column = self.columns[int(worst["sensor_column"][row])]
            found.append(f"{column} {_sd(worst['sensor_value'][row])} sd beyond the training "
                         f"range (cycle {cycles[row]})")
        if worst["unread"][part].max() > self.sd_limit:
            row = start + int(worst["unread"][part].argmax())
            column = self.unread[int(worst["unread_column"][row])]
            found.append(f"{column} (not read) {_sd(worst['unread_value'][row])} sd beyond "
                         f"the training range (cycle {cycles[row]})")
        return found

    def to_dict(self) -> dict:
        return {"columns": list(self.columns), "low": _json(self.low), "high": _json(self.high),
                "spread": _json(self.spread), "settings_low": _json(self.settings_low),
                "settings_high": _json(self.settings_high),
                "settings_spread": _json(self.settings_spread),
                "max_cycle_step": self.max_cycle_step, "max_first_cycle": self.max_first_cycle,
                "sd_limit": self.sd_limit, **({
                    "unread": list(self.unread), "unread_low": _json(self.unread_low),
                    "unread_high": _json(self.unread_high),
                    "unread_spread": _json(self.unread_spread)} if self.unread else {}),
                **({"settings": list(self.settings)}
                   if list(self.settings) != SETTING_COLUMNS else {})}

    @classmethod
    def from_dict(cls, values: dict) -> "Envelope":
        """Read a stored envelope; ValueError naming what is missing or inconsistent."""
        keys = ("columns", "low", "high", "spread", "settings_low", "settings_high",
                "settings_spread")
        missing = [k for k in keys if k not in values]
        if missing:
            raise ValueError(f"envelope lacks {missing}")
        arrays = {k: np.array(values[k], dtype=np.float64) for k in keys[1:]}  # None -> nan
        columns = [str(c) for c in values["columns"]]
        shapes = {arrays[k].shape for k in keys[1:4]}
        names = tuple(str(c) for c in values.get("settings", SETTING_COLUMNS))
        settings = {arrays[k].shape for k in keys[4:]}
        if len(shapes) != 1 or shapes.pop()[1:] != (len(columns),) or settings != {
                (len(arrays["low"]), len(names))}:
            raise ValueError("envelope: ranges do not fit its columns and conditions")
        unread = tuple(str(c) for c in values.get("unread", ()))  # none: an older model
        extra = [np.array(values[k], dtype=np.float64).reshape(len(arrays["low"]), len(unread))
                 for k in ("unread_low", "unread_high", "unread_spread")] if unread else []
        extra = extra or [None, None, None]
        return cls(columns, *arrays.values(), int(values.get("max_cycle_step", 1)),
                   int(values.get("max_first_cycle", 1)),
                   float(values.get("sd_limit", SD_LIMIT)), unread, *extra, names)


def _json(array: np.ndarray) -> list:
    """nan (a condition without training rows) as null: JSON has no nan."""
    return [[None if np.isnan(v) else float(v) for v in row] for row in array]


def _sd(excess: float) -> str:
    return f"{excess:.3g}"

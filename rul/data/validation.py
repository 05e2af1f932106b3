"""One validation for a data set's rows, whatever format they came in.

`validate_rows` turns a frame read from a NASA .txt file, a CSV, a Parquet file, a JSON payload
or a user's own DataFrame into the typed frame the rest of `rul` relies on, or raises a
DataError naming the source (a file, or "input" for frames), the row (from 1 in the order
given: line N of a .txt file) and the column, as the data set's Layout (rul.data.layout,
C-MAPSS's by default) names it.
"""

import re
from pathlib import Path

import numpy as np
import pandas as pd

from rul.data.errors import DataError
from rul.data.layout import CMAPSS, ID_COLUMNS, Layout
from rul.data.schema import COLUMNS

FLOAT_EXACT = 2.0**53  # from here on a float is not every whole number: ids would merge
ID_MAX = np.iinfo(np.int64).max  # the largest id: 2**63 - 1 (a larger one would wrap around)
VALUE_COLUMNS = COLUMNS[2:]  # C-MAPSS's settings and sensors: floats in the result
NAMED = 3  # a message lists this many column names, then counts the rest
SHOWN = 10  # an "expected" list shows this many names or ranges, then counts the rest


def expected(layout: Layout = CMAPSS, optional: tuple = ()) -> str:
    """The columns of `layout`, said briefly (its own names); with `optional` (a served
    model's unread sensors), those the rows need and how many others they may leave out (a
    line stays short enough for a served 400, rul.serving.request_errors.MAX_LINE)."""
    needed = [c for c in layout.names if c not in optional]
    others = len(layout.names) - len(needed)
    return _brief(needed) + (f" ({others} other{'s' if others != 1 else ''} optional)"
                             if others else "")


def _brief(names: list) -> str:
    """Names in order, three or more numbered one after another as a range (s_11..s_15); past
    SHOWN parts, a count of the names left."""
    parts = []  # (text, how many names it stands for)
    start = 0
    while start < len(names):
        end = start + 1
        while end < len(names) and _next(names[end - 1]) == names[end]:
            end += 1
        run = names[start:end]
        parts += [(f"{run[0]}..{run[-1]}", len(run))] if len(run) >= 3 else [(n, 1) for n in run]
        start = end
    left = sum(count for _, count in parts[SHOWN:])
    return ", ".join(text for text, _ in parts[:SHOWN]) + (f" and {left} more" if left else "")


def _next(name: str) -> str | None:
    """The name numbered one after `name` (s_9 -> s_10, op01 -> op02), None without a number."""
    match = re.fullmatch(r"(.*?)(\d+)", name)
    if match is None:
        return None
    number = match[2]
    return f"{match[1]}{int(number) + 1:0{len(number)}d}"


def no_header(layout: Layout = CMAPSS) -> str:
    return ("no header: the first row holds numbers; a CSV needs the header row "
            f"{expected(layout)}")


NO_HEADER = no_header()  # C-MAPSS: unit, cycle, setting_1..setting_3, s_1..s_21


def lacks_header(names, layout: Layout = CMAPSS) -> bool:
    """Whether column names are numbers: a header-less CSV read as if its first row named
    the columns (pandas' default, as MLflow's scoring server reads a CSV body)."""
    names = [str(n).strip() for n in names]
    known = set(layout.names)
    return bool(names) and not any(n in known for n in names) and all(map(_number, names))


def _number(name: str) -> bool:
    """Whether a column name is a number, or one pandas renamed as a repeat ("518.67.1")."""
    try:
        float(name.rsplit(".", 1)[0] if name.count(".") > 1 else name)
    except ValueError:
        return False
    return True


def _names(names: list) -> str:
    """Column names as a list, the first NAMED (each cut to 15 characters), then a count."""
    shown = [str(n) if len(str(n)) <= 15 else str(n)[:12] + "..." for n in names[:NAMED]]
    more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
    return f"{shown}{more}"


def _missing(missing: list, total: int) -> str:
    if len(missing) <= NAMED:
        return f"missing columns {_names(missing)}"
    return ("missing all" if len(missing) == total else f"missing {len(missing)} of the"
            ) + f" {total} columns"


def validate_rows(frame: pd.DataFrame, source: str | Path = "input",
                  layout: Layout = CMAPSS, optional: tuple = ()) -> pd.DataFrame:
    """Check and type raw rows with `layout`'s columns under the data set's own names; return
    a new frame with exactly layout.columns (unit and cycle as rul names them), less those of
    the `optional` sensors the rows leave out (a served model's unread ones).

    Accepted: integer or float columns (or strings holding numbers), unit and cycle whole;
    extra columns are ignored. DataError for a missing column (naming the unexpected ones), no
    rows, a non-numeric or non-finite value, a unit or cycle not a positive whole number below
    2**63 (a larger one would wrap and merge engines), rows of a unit not contiguous, a
    duplicate (unit, cycle), or cycles not strictly increasing within a unit; a message says
    where, never quotes a value (a request's content is not echoed back).
    """
    if not isinstance(frame, pd.DataFrame):
        raise DataError(source, f"expected a table of rows, got {type(frame).__name__}")
    names = layout.names
    needed = [c for c in names if c not in optional]
    missing = [c for c in needed if c not in frame.columns]
    if missing and lacks_header(frame.columns, layout):
        raise DataError(source, no_header(layout))
    if missing:
        unexpected = [c for c in frame.columns if c not in names]
        found = f" (found instead {_names(unexpected)})" if unexpected else ""
        raise DataError(source, f"{_missing(missing, len(needed))}{found}; expected "
                                f"{expected(layout, optional)}")
    if frame.empty:
        raise DataError(source, "no rows")
    values = {name: _numeric(source, frame[name]).astype(np.float64, copy=False)
              for name in (*layout.settings, *layout.sensors) if name in frame.columns}
    ids = {own: _positive_whole(source, layout.own(own) and name,
                                _numeric(source, frame[name], exact=True))
           for own, name in zip(ID_COLUMNS, (layout.unit, layout.time), strict=True)}
    # a column already typed is shared, not copied: typed rows validated again cost no memory
    typed = pd.DataFrame({**ids, **values}, copy=False)
    check_ordering(source, typed, layout)
    return typed


def _numeric(source, values: pd.Series, exact: bool = False) -> np.ndarray:
    """The column as a numeric array; DataError for a non-number or non-finite value. `exact`:
    strings of whole numbers stay integers (int64, uint64 past it), never rounded to 53 bits."""
    name = values.name
    if values.dtype.kind in "iu":
        return values.to_numpy()
    if values.dtype.kind == "f":
        array = values.to_numpy()
    elif values.dtype.kind == "b":
        raise DataError(source, f"column {name}: boolean values, expected numbers")
    else:
        parsed = pd.to_numeric(values, errors="coerce")
        if exact and parsed.dtype.kind in "iu":
            return parsed.to_numpy()
        array = parsed.to_numpy(dtype=np.float64)
        bad = np.isnan(array) & values.notna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(source, f"row {row + 1}, column {name}: is not a number")
    finite = np.isfinite(array)
    if not finite.all():
        row = int(np.argmax(~finite))
        problem = "is missing" if np.isnan(array[row]) else "is not finite"
        raise DataError(source, f"row {row + 1}, column {name}: {problem}")
    return array


def _positive_whole(source, name: str, values: np.ndarray) -> np.ndarray:
    """int64 ids from 1 to ID_MAX; anything else (a fraction, 0, a negative, or a number
    int64 cannot hold, which a cast would silently wrap) is a DataError naming the row."""
    if values.dtype.kind == "u":
        bad = (values < 1) | (values > np.uint64(ID_MAX))
    elif values.dtype.kind == "i":
        bad = values < 1
    else:  # finite floats; 2.0**63 is the first float past ID_MAX
        bad = (values != np.round(values)) | (values < 1) | (values >= 2.0**63)
        inexact = ~bad & (values >= FLOAT_EXACT)
        if inexact.any() and not bad[:int(np.argmax(inexact))].any():
            row = int(np.argmax(inexact))
            raise DataError(source, f"row {row + 1}: {name} is 2**53 or more in a column read "
                                    f"as decimals (a {name} written like 5.0 or 1e3): a float "
                                    f"cannot hold it exactly; write every {name} as a whole "
                                    "number")
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(source, f"row {row + 1}: {name} is not a positive whole number below "
                                "2**63")
    return values.astype(np.int64, copy=False)


def check_ordering(source, frame: pd.DataFrame, layout: Layout = CMAPSS) -> None:
    """Rows of a unit contiguous, no duplicate (unit, cycle), cycles strictly increasing; the
    messages name the columns as `layout` does (C-MAPSS: unit, cycle)."""
    unit = frame["unit"].to_numpy()
    cycle = frame["cycle"].to_numpy()
    what, when = layout.unit, layout.time
    duplicated = frame.duplicated(["unit", "cycle"]).to_numpy()
    if duplicated.any():
        row = int(np.argmax(duplicated))
        raise DataError(source, f"{what} {unit[row]}: duplicate {when} {cycle[row]} (row "
                                f"{row + 1})")
    starts = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    block_units = unit[starts]
    if len(np.unique(block_units)) != len(block_units):
        seen: set[int] = set()
        for start, u in zip(starts, block_units):
            if u in seen:
                raise DataError(source, f"{what} {u}: rows are not contiguous ({what} reappears "
                                        f"at row {start + 1})")
            seen.add(int(u))
    same_unit = unit[1:] == unit[:-1]
    decreasing = same_unit & (cycle[1:] <= cycle[:-1])
    if decreasing.any():
        row = int(np.argmax(decreasing)) + 1
        raise DataError(source, f"{what} {unit[row]}: {'cycles' if when == 'cycle' else when} "
                                f"not strictly increasing ({cycle[row - 1]} then {cycle[row]} "
                                f"at row {row + 1})")

"""One validation for C-MAPSS rows, whatever format they came in.

`validate_rows` turns a frame read from a NASA .txt file, a CSV (with or without a header), a
JSON payload or a user's own DataFrame into the typed frame the rest of `rul` relies on, or
raises a DataError that names the source (a file, or "input" for frames), the row and the
column. Rows are numbered from 1 in the order given (for a .txt file, row N is line N).
"""

from pathlib import Path

import numpy as np
import pandas as pd

from rul.data.errors import DataError
from rul.data.schema import COLUMNS

ID_COLUMNS = COLUMNS[:2]  # unit, cycle: positive whole numbers, int64 in the result
ID_MAX = np.iinfo(np.int64).max  # the largest id: 2**63 - 1 (a larger one would wrap around)
VALUE_COLUMNS = COLUMNS[2:]  # settings and sensors: finite numbers, float64 in the result
EXPECTED = "unit, cycle, setting_1..setting_3, s_1..s_21"  # COLUMNS, said briefly
NAMED = 3  # a message lists this many column names, then counts the rest
NO_HEADER = f"no header: the first row holds numbers; a CSV needs the header row {EXPECTED}"


def lacks_header(names) -> bool:
    """Whether column names are numbers: a header-less CSV read as if its first row named
    the columns (pandas' default, as MLflow's scoring server reads a CSV body)."""
    names = [str(n).strip() for n in names]
    return bool(names) and not any(n in COLUMNS for n in names) and all(map(_number, names))


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


def _missing(missing: list) -> str:
    if len(missing) <= NAMED:
        return f"missing columns {_names(missing)}"
    return ("missing all" if len(missing) == len(COLUMNS) else f"missing {len(missing)} of the"
            ) + f" {len(COLUMNS)} columns"


def validate_rows(frame: pd.DataFrame, source: str | Path = "input") -> pd.DataFrame:
    """Check and type raw C-MAPSS rows; return a new frame with exactly COLUMNS.

    Accepted: integer or float columns (or strings holding numbers); unit and cycle may be
    floats if they are whole. Extra columns are ignored. Raises DataError for a missing
    column (naming the unexpected ones, e.g. a renamed column), no rows, a non-numeric or
    non-finite value (row and column named), a unit or cycle that is not a positive whole
    number below 2**63 (int64's range: a larger one would wrap around and merge engines), rows
    of one unit that are not contiguous, a duplicate (unit, cycle), or cycles that do not
    strictly increase within a unit. A message never quotes a value of the input, only where
    it is (a request's content is not echoed back).
    """
    if not isinstance(frame, pd.DataFrame):
        raise DataError(source, f"expected a table of rows, got {type(frame).__name__}")
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing and lacks_header(frame.columns):
        raise DataError(source, NO_HEADER)
    if missing:
        unexpected = [c for c in frame.columns if c not in COLUMNS]
        found = f" (found instead {_names(unexpected)})" if unexpected else ""
        raise DataError(source, f"{_missing(missing)}{found}; expected {EXPECTED}")
    if frame.empty:
        raise DataError(source, "no rows")
    values = {name: _numeric(source, frame[name]).astype(np.float64, copy=False)
              for name in VALUE_COLUMNS}
    ids = {name: _positive_whole(source, name, _numeric(source, frame[name], exact=True))
           for name in ID_COLUMNS}
    # a column already typed is shared, not copied: typed rows validated again cost no memory
    typed = pd.DataFrame({**ids, **values}, copy=False)
    check_ordering(source, typed)
    return typed


def _numeric(source, values: pd.Series, exact: bool = False) -> np.ndarray:
    """The column as a numeric array; a non-number or non-finite value is a DataError.
    `exact`: strings holding whole numbers stay integers (int64, or uint64 past its range), so
    that an id is never rounded to a float's 53 bits."""
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
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(source, f"row {row + 1}: {name} is not a positive whole number below "
                                "2**63")
    return values.astype(np.int64, copy=False)


def check_ordering(source, frame: pd.DataFrame) -> None:
    """Rows of a unit contiguous, no duplicate (unit, cycle), cycles strictly increasing."""
    unit = frame["unit"].to_numpy()
    cycle = frame["cycle"].to_numpy()
    duplicated = frame.duplicated(["unit", "cycle"]).to_numpy()
    if duplicated.any():
        row = int(np.argmax(duplicated))
        raise DataError(source, f"unit {unit[row]}: duplicate cycle {cycle[row]} (row {row + 1})")
    starts = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    block_units = unit[starts]
    if len(np.unique(block_units)) != len(block_units):
        seen: set[int] = set()
        for start, u in zip(starts, block_units):
            if u in seen:
                raise DataError(
                    source, f"unit {u}: rows are not contiguous (unit reappears at row {start + 1})"
                )
            seen.add(int(u))
    same_unit = unit[1:] == unit[:-1]
    decreasing = same_unit & (cycle[1:] <= cycle[:-1])
    if decreasing.any():
        row = int(np.argmax(decreasing)) + 1
        raise DataError(
            source,
            f"unit {unit[row]}: cycles not strictly increasing "
            f"({cycle[row - 1]} then {cycle[row]} at row {row + 1})",
        )

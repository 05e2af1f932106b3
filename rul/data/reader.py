"""Parse and validate C-MAPSS text files.

Good files take pandas' C parser (fast path). When anything looks off, the file is re-read
line by line to name the first offending line, so an error always says which file, which line
or unit, and what is wrong. Bad input never yields a partial frame. The checks on the parsed
table (whole ids, ordering) are rul.data.validation's, shared with every input format.
"""

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from rul.data.errors import DataError
from rul.data.schema import COLUMNS
from rul.data.validation import NO_HEADER, lacks_header, validate_rows
from rul.files import DATA_LIMIT, INPUT_LIMIT, SizeLimit, refusal

# A plain decimal number, as the C parser reads it ("1_0" or full-width digits are not).
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def read_trajectories(path: str | Path, limit: SizeLimit = DATA_LIMIT) -> pd.DataFrame:
    """Read a train_/test_FDxxx.txt file into a frame with named, typed columns.

    Returns columns `unit, cycle` (int64) and `setting_1..3, s_1..s_21` (float64), rows in
    file order. Raises DataError for a file rul does not read (missing, not a regular file,
    over `limit`), an empty file, a wrong column count, a non-numeric or non-finite value,
    non-integer or non-positive unit/cycle, rows of one unit that are not contiguous, a
    duplicate (unit, cycle), or cycles that do not strictly increase in a unit.
    """
    path = Path(path)
    check_readable(path, limit)
    try:
        frame = pd.read_csv(path, sep=r"\s+", header=None, engine="c", dtype=np.float64)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError) as error:
        _diagnose_lines(path)  # raises with the exact line
        raise DataError(path, f"not a valid C-MAPSS table: {error}") from None
    if frame.shape[1] != len(COLUMNS) or not np.isfinite(frame.to_numpy()).all():
        _diagnose_lines(path)
        raise DataError(path, f"expected {len(COLUMNS)} numeric columns, found {frame.shape[1]}")
    frame.columns = COLUMNS
    return validate_rows(frame, path)


def read_input(path: str | Path, limit: SizeLimit = INPUT_LIMIT) -> pd.DataFrame:
    """The rows a user gives to predict (`rul predict`, the fleet page): a C-MAPSS text file
    (validated), a CSV with a header or a Parquet file (as read: the model checks them); a file
    over `limit` (or not a regular file) is refused before it is read."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        return read_trajectories(path, limit)
    check_readable(path, limit)
    if suffix != ".csv":
        import pyarrow

        try:
            return pd.read_parquet(path)
        except (pyarrow.ArrowException, OSError, ValueError) as error:
            said = " ".join(str(error).split())[:160]
            raise DataError(path, f"not a readable Parquet file: {said}") from None
    try:  # "n/a" is not a number: only an empty cell is missing
        frame = pd.read_csv(path, dtype=str, skipinitialspace=True, keep_default_na=False,
                            na_values=[""])
    except pd.errors.EmptyDataError:
        raise DataError(path, "file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise DataError(path, f"not a readable CSV: {error}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.empty:
        raise DataError(path, NO_HEADER if lacks_header(frame.columns) else
                        "header but no rows")
    return frame


def read_rul(path: str | Path, n_units: int, limit: SizeLimit = DATA_LIMIT) -> np.ndarray:
    """Read RUL_FDxxx.txt: one non-negative integer per test unit, in unit order."""
    path = Path(path)
    check_readable(path, limit)
    values = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) != 1:
            raise DataError(path, f"line {number}: expected one RUL value, found {len(tokens)}")
        try:
            value = float(tokens[0])
        except ValueError:
            raise DataError(path, f"line {number}: {tokens[0]!r} is not a number") from None
        if not math.isfinite(value) or value != int(value):
            raise DataError(path, f"line {number}: RUL {tokens[0]!r} is not a whole number")
        if value < 0:
            raise DataError(path, f"line {number}: negative RUL {tokens[0]}")
        values.append(int(value))
    if not values:
        raise DataError(path, "file is empty")
    if len(values) != n_units:
        raise DataError(path, f"{len(values)} RUL values but the test file has {n_units} units")
    return np.asarray(values, dtype=np.int64)


def check_readable(path: Path, limit: SizeLimit) -> None:
    """DataError when rul will not read `path` (rul.files.refusal), before a byte is read."""
    refused = refusal(path, limit)
    if refused:
        raise DataError(path, refused)


def _diagnose_lines(path: Path) -> None:
    """Find and raise the first line that is not 26 finite numbers."""
    text = path.read_text(errors="replace")
    if not text.strip():
        raise DataError(path, "file is empty")
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) != len(COLUMNS):
            raise DataError(
                path, f"line {number}: expected {len(COLUMNS)} columns, found {len(tokens)}"
            )
        for column, token in zip(COLUMNS, tokens):
            if NUMBER.fullmatch(token) and math.isfinite(float(token)):
                continue
            try:
                finite = math.isfinite(float(token))
            except ValueError:
                finite = True
            if not finite:
                raise DataError(
                    path, f"line {number}, column {column}: value {token} is not finite"
                )
            raise DataError(path, f"line {number}, column {column}: {token!r} is not a number")

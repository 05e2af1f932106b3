"""A fleet's own tables: CSV or Parquet with named columns (or C-MAPSS text), read with
pyarrow, their columns resolved against the `data:` section's description (names or glob
patterns) into a Layout, and validated as every input is (rul.data.validation).

Every problem is one DataError naming the file and the key (a named column missing, a pattern
matching nothing or a column that does not hold numbers, one column in two roles, a test table
short of the training table's columns, a CSV split by the wrong delimiter); columns the
description does not name are ignored, named in one warning.

The columns come in one canonical order whatever the table's (so a table with its columns
reordered trains the same model): the order the description names them, a pattern's matches
in the natural order of their names (`natural`).
"""

import fnmatch
import re
import warnings
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from rul.data.delimiter import delimiter_of, misread, named
from rul.data.errors import SHOWN_CHARS, DataError, quoted
from rul.data.layout import Layout
from rul.data.reader import check_readable, read_trajectories
from rul.data.schema import COLUMNS
from rul.data.validation import validate_rows
from rul.files import DATA_LIMIT, SizeLimit

SUFFIXES = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".txt": "cmapss"}
NAMED = 5  # a message lists this many columns, then counts the rest
MAX_PATTERN = 256  # characters of a name or glob pattern in the data description


class IgnoredColumnsWarning(UserWarning):
    """A table holds columns the data description does not name: they are not read."""


def table_format(path: Path, format: str = "auto") -> str:
    """csv, parquet or cmapss: as given, or by the file's suffix."""
    if format != "auto":
        return format
    found = SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise DataError(path, f"cannot tell its format from the suffix {path.suffix!r} "
                              "(.csv, .parquet, .txt); set data.format")
    return found


def read_table(path: str | Path, format: str = "auto", limit: SizeLimit = DATA_LIMIT,
               columns: list[str] | None = None, delimiter: str = "auto") -> pd.DataFrame:
    """The table at `path`: the `columns` named (None: every one) as the file holds them
    (C-MAPSS text: its 26 named columns, validated; a CSV split by `delimiter`, see
    rul.data.delimiter). Only those are read;
    a named column of list or nested cells is a DataError, never decoded."""
    path = Path(path)
    kind = table_format(path, format)
    if kind == "cmapss":
        table = read_trajectories(path, limit)
        return table if columns is None else table[columns]
    check_readable(path, limit)
    import pyarrow

    delimiter = delimiter_of(path, delimiter) if kind == "csv" else ","
    types = dict(_schema(path, kind, delimiter))
    for name in types if columns is None else columns:
        if pyarrow.types.is_nested(types[name]):
            raise DataError(path, f"column {quoted(name)}: list or nested cells; a column holds "
                                  "one number per row")
    with _unreadable(path, kind, delimiter):
        if kind == "parquet":
            import pyarrow.parquet

            table = pyarrow.parquet.read_table(path, columns=columns)
        else:
            import pyarrow.csv

            table = pyarrow.csv.read_csv(
                path, parse_options=pyarrow.csv.ParseOptions(delimiter=delimiter),
                convert_options=pyarrow.csv.ConvertOptions(include_columns=columns))
    if table.num_rows == 0:
        raise DataError(path, "no rows")
    return table.to_pandas()


def table_columns(path: str | Path, format: str = "auto", limit: SizeLimit = DATA_LIMIT,
                  delimiter: str = "auto") -> list[str]:
    """The names of the columns of the table at `path`, read from its Parquet footer or its
    CSV header (the first block, split by `delimiter`), not its rows; DataError for a CSV
    read as one column whose header holds another delimiter."""
    path = Path(path)
    kind = table_format(path, format)
    if kind == "cmapss":
        return list(COLUMNS)
    check_readable(path, limit)
    delimiter = delimiter_of(path, delimiter) if kind == "csv" else ","
    names = [name for name, _ in _schema(path, kind, delimiter)]
    if kind == "csv" and (wrong := misread(names, delimiter)):
        raise DataError(path, wrong)
    return names


def _schema(path: Path, kind: str, delimiter: str = ",") -> list:
    """(name, pyarrow type) of each column of a CSV or Parquet file, read from its header."""
    with _unreadable(path, kind, delimiter):
        if kind == "parquet":
            import pyarrow.parquet

            schema = pyarrow.parquet.read_schema(path)
        else:
            import pyarrow.csv

            with pyarrow.csv.open_csv(path, parse_options=pyarrow.csv.ParseOptions(
                    delimiter=delimiter)) as reader:
                schema = reader.schema
    return [(str(name), schema.field(i).type) for i, name in enumerate(schema.names)]


@contextmanager
def _unreadable(path: Path, kind: str, delimiter: str = ","):
    """pyarrow's refusal to read `path` as one DataError naming the file (and a CSV's
    delimiter)."""
    import pyarrow

    try:
        yield
    except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, OSError) as error:
        said = " ".join(str(error).split())[:200]
        what = f"CSV file (delimiter {named(delimiter)})" if kind == "csv" else "Parquet file"
        raise DataError(path, f"not a readable {what}: {said}") from None


def shown(name) -> str:
    """A column's name as a message shows it: as written when it is plain printable text,
    else escaped as Python writes a string (no escape sequence or newline reaches the
    terminal, none cuts the line), and cut to SHOWN_CHARS characters."""
    text = str(name)
    text = text if text.isprintable() and text.strip() == text and text else repr(text)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def _listed(names: list) -> str:
    listed = ", ".join(shown(n) for n in names[:NAMED])
    return listed + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")


def is_pattern(item: str) -> bool:
    """Whether a name of the description is a glob pattern (`s_*`, `T?`, `[NP]*`)."""
    return any(c in item for c in "*?[")


def natural(name: str) -> tuple:
    """The natural order of column names: runs of digits compare as numbers (s_2 before s_10,
    T2 before T24 before T30), then the name itself breaks a tie (s_01, s_1)."""
    parts = re.split(r"([0-9]+)", name)
    return (*((0, int(p)) if p[0] in "0123456789" else (1, p) for p in parts if p), (2, name))


def resolve(wanted: list[str], columns: list[str], role: str, path: Path,
            taken: tuple = ()) -> list[str]:
    """The columns `wanted` names, in order: a name as given, a glob pattern (`s_*`) as the
    table's columns it matches in their natural order (never the table's), less those `taken`
    by another role; DataError for a name the table lacks or a pattern that matches nothing."""
    found = []
    for item in wanted:
        if len(item) > MAX_PATTERN:  # fnmatch takes seconds on 20,000 [
            raise DataError(path, f"data.{role}: a name or pattern of {len(item):,} characters"
                                  f" ({quoted(item)}); at most {MAX_PATTERN}")
        if is_pattern(item):
            matched = sorted((c for c in columns
                              if fnmatch.fnmatchcase(c, item) and c not in taken), key=natural)
            if not matched:
                raise DataError(path, f"data.{role}: the pattern {quoted(item)} matches no column "
                                      f"(columns: {_listed(columns)})")
            found += [c for c in matched if c not in found]
        elif item not in columns:
            close = [c for c in columns if c.lower() == item.lower()]
            hint = f" (did you mean {quoted(close[0])}?)" if close else ""
            raise DataError(path, f"data.{role}: no column {quoted(item)}{hint} (columns: "
                                  f"{_listed(columns)})")
        elif item not in found:
            found.append(item)
    return found


def layout_of(section, columns: list[str], path: Path) -> Layout:
    """The Layout the `data:` section describes, resolved against a table's `columns`."""
    columns = [str(c) for c in columns]
    for role in ("unit", "time"):
        resolve([getattr(section, role)], columns, role, path)
    ids = (section.unit, section.time)
    settings = resolve(list(section.settings), columns, "settings", path, ids)
    sensors = resolve(list(section.sensors), columns, "sensors", path, (*ids, *settings))
    roles = {section.unit: "unit", section.time: "time"}
    for role, names in (("settings", settings), ("sensors", sensors)):
        for name in names:
            if name in roles:
                raise DataError(path, f"column {quoted(name)} is both data.{roles[name]} and "
                                      f"data.{role}")
            roles[name] = role
    return Layout(section.unit, section.time, tuple(settings), tuple(sensors))


def described(section, column: str) -> bool:
    """Whether the `data:` section names `column` or a pattern of it matches it (a sensor
    left out for holding one value is described, not unknown)."""
    items = [section.unit, section.time, *section.settings, *section.sensors]
    return any(fnmatch.fnmatchcase(column, item) for item in items)


def not_numbers(values: pd.Series) -> str | None:
    """What a column holds when it is no column of numbers (true/false values, dates, text
    that no row reads as a number); None when it is (a text column of numbers with a bad row
    is validate_rows' to name, by its row)."""
    kind = values.dtype.kind
    if kind == "b":
        return "true/false values"
    if kind in "mM":
        return "dates"
    if kind in "iuf":
        return None
    present = values.dropna()
    if len(present) and pd.to_numeric(present, errors="coerce").isna().all():
        return "text"
    return None


def check_numbers(section, layout: Layout, raw: pd.DataFrame, path: Path) -> None:
    """DataError naming the key, and the pattern that caught it, for a setting or sensor
    column that does not hold numbers."""
    for role in ("settings", "sensors"):
        for column in getattr(layout, role):
            held = not_numbers(raw[column])
            if held is None:
                continue
            wanted = list(getattr(section, role))
            if column in wanted:
                raise DataError(path, f"data.{role}: the column {column!r} holds {held}, not "
                                      "numbers")
            pattern = next(p for p in wanted if is_pattern(p) and fnmatch.fnmatchcase(column, p))
            raise DataError(path, f"data.{role}: the pattern {pattern!r} matches the column "
                                  f"{column!r}, which holds {held}, not numbers: narrow the "
                                  "pattern or name the columns")


def read_rows(path: str | Path, section, layout: Layout | None = None,
              limit: SizeLimit = DATA_LIMIT, keep: dict[str, str] | None = None
              ) -> tuple[pd.DataFrame, Layout, pd.DataFrame]:
    """(the rows of the table at `path` as rul holds them: validated, typed, unit and cycle
    renamed; its Layout, resolved from the `data:` section unless given (a test table must
    have the training table's columns); the columns `keep` names (the description's key ->
    its column), as read, beside it)."""
    path = Path(path)
    keep = keep or {}
    delimiter = delimiter_of(path, section.delimiter) if table_format(
        path, section.format) == "csv" else ","
    columns = table_columns(path, section.format, limit, delimiter)
    try:
        if layout is None:
            layout = layout_of(section, columns, path)
        else:
            missing = [c for c in layout.names if c not in columns]
            if missing:
                raise DataError(path, f"lacks the columns {_listed(missing)} of the training "
                                      "table (a test table has the training table's columns)")
        for key, column in keep.items():
            resolve([column], columns, key, path)
    except DataError as error:
        if delimiter == ",":
            raise
        raise DataError(path, f"{error.problem} (read with the delimiter "
                              f"{named(delimiter)})") from None
    extra = [c for c in columns if c not in layout.names and c not in keep.values()
             and not described(section, c)]
    if extra:
        warnings.warn(IgnoredColumnsWarning(
            f"{path.name}: columns not in the data description, not read: {_listed(extra)}"),
            stacklevel=3)
    kept = list(dict.fromkeys(keep.values()))
    raw = read_table(path, section.format, limit, list(dict.fromkeys([*layout.names, *kept])),
                     delimiter)
    check_numbers(section, layout, raw, path)
    return validate_rows(raw[layout.names], path, layout), layout, raw[kept]

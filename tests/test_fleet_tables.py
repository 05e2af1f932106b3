"""A fleet's tables read as the data description names them (rul.data.tables), fast: only the
named columns are read (an unnamed column of list cells costs nothing), a named one of list
cells is one line, a column's name is shown escaped (an escape sequence never reaches the
terminal, a newline never cuts a line), and a pattern of 20,000 `[` is refused at once."""

import time
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rul.config.data import DataSection
from rul.data.errors import DataError
from rul.data.tables import IgnoredColumnsWarning, read_rows

SENSORS = ["s_1", "s_2"]


def table(rows: int = 6) -> pd.DataFrame:
    return pd.DataFrame({"unit": np.repeat([1, 2], rows // 2),
                         "cycle": np.tile(np.arange(1, rows // 2 + 1), 2),
                         "s_1": np.linspace(0, 1, rows), "s_2": np.linspace(1, 2, rows)})


def section(**given) -> DataSection:
    return DataSection(**{"name": "fleet", "train": "t.parquet", "sensors": SENSORS, **given})


def read(path, **given):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        rows, _, _ = read_rows(path, section(**given))
    return rows, [str(w.message) for w in said if w.category is IgnoredColumnsWarning]


def test_only_the_named_columns_are_read(tmp_path, monkeypatch):
    """A column no key names, of list cells (50M zeros once took 1.65 GB), is not decoded."""
    frame = pa.Table.from_pandas(table(), preserve_index=False).append_column(
        "junk", pa.array([[0.0] * 1000] * 6))
    pq.write_table(frame, tmp_path / "t.parquet")
    asked = []
    original = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, columns=None, **kw: (
        asked.append(columns), original(path, columns=columns, **kw))[1])
    rows, ignored = read(tmp_path / "t.parquet")
    assert asked == [["unit", "cycle", "s_1", "s_2"]]
    assert rows.shape == (6, 4)
    assert ignored == ["t.parquet: columns not in the data description, not read: junk"]
    (tmp_path / "t.csv").write_text(table().assign(x=7).to_csv(index=False))
    rows, ignored = read(tmp_path / "t.csv", train="t.csv")
    assert list(rows.columns) == ["unit", "cycle", "s_1", "s_2"] and ignored


def test_a_named_column_of_list_cells_is_one_line(tmp_path):
    frame = table()
    frame["s_2"] = [[1.0, 2.0]] * 6
    frame.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataError) as raised:
        read(tmp_path / "t.parquet")
    assert str(raised.value).endswith(
        "column 's_2': list or nested cells; a column holds one number per row")


def test_names_with_escapes_and_newlines_are_shown_escaped(tmp_path):
    frame = table().assign(**{"\x1b]0;owned\x07\x1b[2J": 1.0, "a\nb": 2.0})
    frame.to_parquet(tmp_path / "t.parquet")
    _, ignored = read(tmp_path / "t.parquet")
    assert ignored == ["t.parquet: columns not in the data description, not read: "
                       "'\\x1b]0;owned\\x07\\x1b[2J', 'a\\nb'"]
    with pytest.raises(DataError) as raised:
        read(tmp_path / "t.parquet", sensors=["s_1", "\x1b]2;x\x07"])
    said = str(raised.value)
    assert "\x1b" not in said and "\n" not in said
    assert ("no column '\\x1b]2;x\\x07' (columns: unit, cycle, s_1, s_2, "
            "'\\x1b]0;owned\\x07\\x1b[2J' and 1 more)") in said


def test_a_pattern_of_20_000_brackets_is_refused_at_once_in_a_short_line(tmp_path):
    table().to_parquet(tmp_path / "t.parquet")
    started = time.monotonic()
    with pytest.raises(DataError) as raised:
        read(tmp_path / "t.parquet", sensors=["[" * 20_000])
    assert time.monotonic() - started < 2
    said = str(raised.value)
    assert len(said) < 300 and said.endswith(
        "data.sensors: a name or pattern of 20,000 characters ('" + "[" * 37
        + "'...); at most 256")


def test_engines_of_one_row_each_are_one_line_before_any_choice(tmp_path):
    """Once "every sensor is constant" (features=informative) or an IndexError traceback
    (features=all, window=1): a unit column that names rows, not engines."""
    from rul.data import load_dataset

    rows = table(60).assign(unit=np.arange(1, 61), cycle=1)
    rows.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(DataError) as raised:
        load_dataset(section(train="t.csv", test_fraction=0.2), tmp_path)
    assert str(raised.value) == (
        f"{tmp_path / 't.csv'}: every unit has one row (60 units): a unit is one engine's "
        "history, a row per cycle; is data.unit (unit) the column naming the engine?")
    rows.assign(unit=np.repeat(np.arange(1, 7), 10), cycle=np.tile(np.arange(1, 11), 6)).to_csv(
        tmp_path / "t.csv", index=False)  # six engines of ten cycles: read
    assert len(load_dataset(section(train="t.csv", test_fraction=0.3), tmp_path).train)

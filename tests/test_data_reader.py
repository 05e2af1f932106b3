"""The C-MAPSS readers: typed frames for good files, precise DataErrors for bad ones."""

from pathlib import Path

import numpy as np
import pytest

from rul.data import DataError, load_subset
from rul.data.reader import read_rul, read_trajectories
from rul.data.schema import COLUMNS, SENSOR_COLUMNS, SETTING_COLUMNS, check_subset, file_names

# Line layout of the default synthetic train file (see conftest.TRAIN_LENGTHS = 52, 60, 35, 47,
# 41): unit 1 on lines 1-52, unit 2 on 53-112, unit 3 on 113-147, unit 4 on 148-194, unit 5 on
# 195-235. Column index of sensor s_k is 4 + k.
N_TRAIN_ROWS = 235


def column(name: str) -> int:
    return COLUMNS.index(name)


def assert_data_error(path: Path, *fragments: str, reader=read_trajectories) -> str:
    """Read `path`, expect a DataError naming the file and containing every fragment."""
    with pytest.raises(DataError) as info:
        reader(path)
    message = str(info.value)
    assert info.value.path == path
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


@pytest.fixture
def train_path(write_cmapss) -> Path:
    return write_cmapss() / "train_FD001.txt"


# --- good files --------------------------------------------------------------------------------


def test_good_file_gives_named_typed_columns(train_path, make_frame):
    frame = read_trajectories(train_path)

    assert list(frame.columns) == COLUMNS
    assert frame["unit"].dtype == np.int64
    assert frame["cycle"].dtype == np.int64
    for name in SETTING_COLUMNS + SENSOR_COLUMNS:
        assert frame[name].dtype == np.float64, name
    assert len(frame) == N_TRAIN_ROWS
    assert frame.groupby("unit").size().tolist() == [52, 60, 35, 47, 41]
    assert frame["cycle"].iloc[:3].tolist() == [1, 2, 3]
    expected = make_frame((52, 60, 35, 47, 41), seed=0)
    np.testing.assert_allclose(
        frame[SETTING_COLUMNS + SENSOR_COLUMNS].to_numpy(),
        expected[SETTING_COLUMNS + SENSOR_COLUMNS].to_numpy(),
        atol=5e-5,  # written with 4 decimals
    )


def test_load_subset_on_synthetic_files(write_cmapss):
    directory = write_cmapss(rul=[5, 0, 17, 123])
    subset = load_subset("fd001", directory, download=False)

    assert subset.name == "FD001"
    assert len(subset.train) == N_TRAIN_ROWS
    assert subset.test["unit"].unique().tolist() == [1, 2, 3, 4]
    assert len(subset.test) == 31 + 45 + 22 + 38
    assert subset.test_rul.dtype == np.int64
    assert subset.test_rul.tolist() == [5, 0, 17, 123]
    assert subset.files == {role: directory / name for role, name in file_names("FD001").items()}


def test_rul_file_reads_whole_numbers_and_skips_blank_lines(tmp_path):
    path = tmp_path / "RUL_FD001.txt"
    path.write_text("112 \n98\n\n69.0\n")
    values = read_rul(path, 3)
    assert values.dtype == np.int64
    assert values.tolist() == [112, 98, 69]


# --- trajectory files: format errors -----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "edit", "found"),
    [
        (1, lambda t: t[:-1], 25),  # first line short: pandas infers 25 columns
        (40, lambda t: t[:-1], 25),  # a short line in the middle
        (40, lambda t: [*t, "1.0"], 27),  # a long line in the middle
        (N_TRAIN_ROWS, lambda t: [*t, "1.0", "2.0"], 28),  # the last line
        (100, lambda t: t[:3], 3),
    ],
)
def test_wrong_column_count_names_the_line(train_path, rewrite, line, edit, found):
    rewrite(train_path, line, edit)
    assert_data_error(train_path, f"line {line}: expected 26 columns, found {found}")


@pytest.mark.parametrize(
    ("line", "name", "token"),
    [
        (70, "s_4", "abc"),
        (1, "unit", "one"),
        (235, "setting_2", "0.0.1"),
        (150, "s_21", "NA"),  # pandas reads NA as NaN; it is still not a number
    ],
)
def test_non_numeric_value_names_line_and_column(train_path, rewrite, line, name, token):
    def edit(tokens):
        tokens[column(name)] = token

    rewrite(train_path, line, edit)
    assert_data_error(train_path, f"line {line}, column {name}: {token!r} is not a number")


def test_number_that_pandas_rejects_but_python_accepts_is_still_a_data_error(train_path, rewrite):
    # "1_0" is not a C-MAPSS number: pandas' C parser rejects it, Python's float() accepts it.
    # Whatever the reader decides, it must not leak a bare pandas error without the file name.
    def edit(tokens):
        tokens[column("s_9")] = "1_0"

    rewrite(train_path, 60, edit)
    assert_data_error(train_path, "line 60", "s_9")


@pytest.mark.parametrize("token", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_non_finite_value_names_line_and_column(train_path, rewrite, token):
    def edit(tokens):
        tokens[column("s_7")] = token

    rewrite(train_path, 123, edit)
    assert_data_error(train_path, f"line 123, column s_7: value {token} is not finite")


def test_non_finite_cycle_is_reported(train_path, rewrite):
    def edit(tokens):
        tokens[column("cycle")] = "nan"

    rewrite(train_path, 7, edit)
    assert_data_error(train_path, "line 7, column cycle: value nan is not finite")


@pytest.mark.parametrize("text", ["", "\n", "   \n\n  \n"])
def test_empty_file(tmp_path, text):
    path = tmp_path / "test_FD001.txt"
    path.write_text(text)
    assert_data_error(path, "file is empty")


def test_missing_file(tmp_path):
    assert_data_error(tmp_path / "train_FD001.txt", "file not found")
    assert_data_error(tmp_path / "RUL_FD001.txt", "file not found",
                      reader=lambda p: read_rul(p, 1))


@pytest.mark.parametrize(
    ("name", "token"),
    [("cycle", "0"), ("unit", "1.5"), ("cycle", "-3"), ("unit", str(2**63)),
     ("unit", str(2**70)), ("cycle", "1e300")],
)
def test_unit_and_cycle_must_be_positive_whole_numbers(train_path, rewrite, name, token):
    """Past int64 (2**63 and up) an id would wrap around and merge engines: refused too."""
    def edit(tokens):
        tokens[column(name)] = token

    rewrite(train_path, 10, edit)
    assert_data_error(train_path, f"row 10: {name} is not a positive whole number below 2**63")


# --- trajectory files: ordering errors ---------------------------------------------------------


def test_cycles_not_strictly_increasing_names_unit_and_row(train_path):
    lines = train_path.read_text().splitlines()
    # unit 2, cycles 28 and 29 on lines 80 and 81: swap them
    lines[79], lines[80] = lines[80], lines[79]
    train_path.write_text("\n".join(lines) + "\n")
    assert_data_error(train_path, "unit 2: cycles not strictly increasing (29 then 28 at row 81)")


def test_adjacent_duplicate_cycle(train_path, rewrite):
    def edit(tokens):
        tokens[column("cycle")] = "28"  # line 81 is unit 2, cycle 29; line 80 has cycle 28

    rewrite(train_path, 81, edit)
    assert_data_error(train_path, "unit 2: duplicate cycle 28 (row 81)")


def test_distant_duplicate_cycle(train_path, rewrite):
    def edit(tokens):
        tokens[column("cycle")] = "3"  # unit 4 starts on line 148: its cycle 3 is on line 150

    rewrite(train_path, 160, edit)  # unit 4, cycle 13 -> 3
    assert_data_error(train_path, "unit 4: duplicate cycle 3 (row 160)")


def test_same_cycle_in_different_units_is_fine(train_path):
    frame = read_trajectories(train_path)
    assert (frame["cycle"] == 1).sum() == 5


def test_non_contiguous_unit_rows(train_path):
    lines = train_path.read_text().splitlines()
    last_of_unit_1 = lines.pop(51)  # unit 1, cycle 52 -> moved to the end of the file
    lines.append(last_of_unit_1)
    train_path.write_text("\n".join(lines) + "\n")
    assert_data_error(
        train_path, "unit 1: rows are not contiguous (unit reappears at row 235)"
    )


def test_unit_interleaved_in_the_middle(train_path):
    lines = train_path.read_text().splitlines()
    moved = lines.pop(140)  # unit 3, cycle 28 -> between units 1 and 2 (becomes row 53)
    lines.insert(52, moved)
    train_path.write_text("\n".join(lines) + "\n")
    # unit 3 first shows up at row 53, so its block starting at row 114 is the reappearance
    assert_data_error(
        train_path, "unit 3: rows are not contiguous (unit reappears at row 114)"
    )


def test_errors_in_the_test_file_surface_through_load_subset(write_cmapss, rewrite):
    directory = write_cmapss()
    test_path = directory / "test_FD001.txt"

    def edit(tokens):
        tokens[column("s_11")] = "nan"

    rewrite(test_path, 77, edit)
    with pytest.raises(DataError) as info:
        load_subset("FD001", directory, download=False)
    assert info.value.path == test_path
    assert str(info.value) == f"{test_path}: line 77, column s_11: value nan is not finite"


def test_test_units_must_be_in_increasing_order(write_cmapss):
    directory = write_cmapss()
    test_path = directory / "test_FD001.txt"
    lines = test_path.read_text().splitlines()
    # unit 1 (31 lines) becomes unit 9: units 9, 2, 3, 4
    lines = ["9" + line[1:] for line in lines[:31]] + lines[31:]
    test_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as info:
        load_subset("FD001", directory, download=False)
    assert info.value.path == test_path
    assert "units are not in increasing order" in str(info.value)


# --- RUL files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rul", [[10, 17, 24], [10, 17, 24, 31, 38]])
def test_rul_count_must_match_test_units(write_cmapss, rul):
    directory = write_cmapss(rul=rul)
    rul_path = directory / "RUL_FD001.txt"
    with pytest.raises(DataError) as info:
        load_subset("FD001", directory, download=False)
    assert info.value.path == rul_path
    assert str(info.value) == (
        f"{rul_path}: {len(rul)} RUL values but the test file has 4 units"
    )


def test_negative_rul(write_cmapss):
    directory = write_cmapss(rul=[10, -5, 24, 31])
    path = directory / "RUL_FD001.txt"
    assert_data_error(path, "line 2: negative RUL -5", reader=lambda p: read_rul(p, 4))
    with pytest.raises(DataError, match="line 2: negative RUL -5"):
        load_subset("FD001", directory, download=False)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("10\n17\n12.5\n31\n", "line 3: RUL '12.5' is not a whole number"),
        ("10\n17\nnan\n31\n", "line 3: RUL 'nan' is not a whole number"),
        ("10\ninf\n24\n31\n", "line 2: RUL 'inf' is not a whole number"),
        ("10\nabc\n24\n31\n", "line 2: 'abc' is not a number"),
        ("10 11\n17\n24\n31\n", "line 1: expected one RUL value, found 2"),
        ("", "file is empty"),
        ("\n \n", "file is empty"),
    ],
)
def test_bad_rul_lines(tmp_path, text, problem):
    path = tmp_path / "RUL_FD001.txt"
    path.write_text(text)
    message = assert_data_error(path, reader=lambda p: read_rul(p, 4))
    assert message == f"{path}: {problem}"


# --- subset names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["FD005", "FD01", "", "train_FD001"])
def test_unknown_subset_name(name):
    with pytest.raises(ValueError) as info:
        check_subset(name)
    assert not isinstance(info.value, DataError)
    assert repr(name) in str(info.value)
    assert "FD001, FD002, FD003, FD004" in str(info.value)


def test_load_subset_rejects_unknown_subset_before_touching_files(tmp_path):
    with pytest.raises(ValueError, match="unknown C-MAPSS subset 'FD007'") as info:
        load_subset("FD007", tmp_path, download=False)
    assert not isinstance(info.value, DataError)


@pytest.mark.parametrize(("name", "canonical"), [("fd001", "FD001"), (" Fd004 ", "FD004")])
def test_subset_names_are_normalized(name, canonical):
    assert check_subset(name) == canonical
    assert file_names(name) == {
        "train": f"train_{canonical}.txt", "test": f"test_{canonical}.txt",
        "rul": f"RUL_{canonical}.txt",
    }


# --- the real FD001 ------------------------------------------------------------------------------


def test_real_fd001(fd001, real_data_dir):
    assert fd001.name == "FD001"
    assert len(fd001.train) == 20631
    assert fd001.train["unit"].nunique() == 100
    assert fd001.train["unit"].unique().tolist() == list(range(1, 101))
    assert fd001.test["unit"].nunique() == 100
    assert len(fd001.test) == 13096
    assert len(fd001.test_rul) == 100
    assert fd001.test_rul[:3].tolist() == [112, 98, 69]
    assert fd001.test_rul.dtype == np.int64
    assert fd001.files["train"] == real_data_dir / "train_FD001.txt"
    for frame in (fd001.train, fd001.test):
        assert list(frame.columns) == COLUMNS
        assert frame["unit"].dtype == np.int64 and frame["cycle"].dtype == np.int64
        assert all(frame[c].dtype == np.float64 for c in SETTING_COLUMNS + SENSOR_COLUMNS)
    # first row of the archive: "1 1 -0.0007 -0.0004 100.0 518.67 641.82 ..."
    first = fd001.train.iloc[0]
    assert (first["unit"], first["cycle"]) == (1, 1)
    assert first["setting_1"] == -0.0007 and first["s_1"] == 518.67 and first["s_2"] == 641.82
    # unit 1 runs 192 cycles in FD001
    assert fd001.train.groupby("unit")["cycle"].max().iloc[0] == 192

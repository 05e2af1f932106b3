"""A CSV's delimiter (rul.data.delimiter): the one its first lines agree on, or as given; a
file read with the wrong one is named, with the key to set."""

import pytest

from rul.data.delimiter import delimiter_of, misread


@pytest.mark.parametrize("delimiter", [",", ";", "\t", "|"])
def test_the_delimiter_the_first_lines_agree_on_is_found(tmp_path, delimiter):
    rows = ["engine_id,flight_cycle,T24,P30", "1,1,641.82,554.36", "1,2,642.15,553.75"]
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(r.replace(",", delimiter) for r in rows) + "\n")
    assert delimiter_of(path) == delimiter


def test_decimal_commas_do_not_pass_for_the_delimiter(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("engine_id;T24;P30\n1;641,82;554,36\n2;642,15;553,75\n")
    assert delimiter_of(path) == ";"


def test_a_comma_when_no_candidate_agrees_and_as_given_when_given(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("engine_id\n1\n2\n")
    assert delimiter_of(path) == ","
    assert delimiter_of(path, "tab") == "\t" and delimiter_of(path, ";") == ";"


def test_a_header_read_as_one_column_names_the_key_to_set():
    said = misread(["engine_id;flight_cycle;T24"], ",")
    assert said == ("read with the delimiter ',', its header is one column "
                    "'engine_id;flight_cycle;T24', which holds ';': set data.delimiter: ';'")
    assert misread(["engine_id", "flight_cycle"], ",") is None
    assert misread(["engine_id"], ",") is None

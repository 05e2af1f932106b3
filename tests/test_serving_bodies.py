"""A request's body and answer without a server: rul.serving.bodies reads the formats as
MLflow's parser does (the same frame, so the same numbers), refuses the rest in one line that
quotes nothing of the body; rul.serving.answers writes strict JSON; rul.serving.scoring turns
every outcome into its status and line. A stand-in model runs rul's predictor on constant
networks (the served model end to end is in test_serving.py)."""

import io
import json

import numpy as np
import pandas as pd
import pytest
from conftest import synthetic_frame
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import scoring_server

from rul.data.validation import validate_rows
from rul.evaluation.conformal import fit_banded
from rul.preprocessing import Preprocessor
from rul.serving import bodies, predictor
from rul.serving.answers import error_json, predictions_json, refusal_line
from rul.serving.bodies import CSV, JSON, PARQUET, BodyError, decoded_size, read_body
from rul.serving.request_errors import RequestError
from rul.serving.scoring import answer

ROWS = synthetic_frame([40, 35, 50], seed=5)


def strict(text: bytes):
    """json.loads that refuses NaN and Infinity, as JavaScript's JSON.parse does."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def split_body(rows: pd.DataFrame, **params) -> bytes:
    split = json.loads(rows.to_json(orient="split", index=False))
    return json.dumps({"dataframe_split": split, **({"params": params} if params else {})}
                      ).encode()


def mlflow_frame(body: bytes, media: str) -> pd.DataFrame:
    """The frame MLflow's scoring server made of a body."""
    if media == CSV:
        return scoring_server.parse_csv_input(io.StringIO(body.decode()))
    if media == PARQUET:
        return scoring_server.parse_parquet_input(io.BytesIO(body))
    return scoring_server.infer_and_parse_data(
        {k: v for k, v in json.loads(body).items() if k != "params"})


@pytest.mark.parametrize("rows_per_part", [7, bodies.ROWS_PER_PART])
def test_every_format_reads_as_mlflow_reads_it(monkeypatch, rows_per_part):
    """The same rows, whatever the format, columns in any order, JSON built a part at a time
    or at once: the frame validates to what MLflow's parser gives."""
    monkeypatch.setattr(bodies, "ROWS_PER_PART", rows_per_part)
    rows = ROWS[ROWS.columns[::-1]].astype({"s_17": np.int64})
    records = json.dumps({"dataframe_records": json.loads(rows.to_json(orient="records"))})
    cases = [(split_body(rows, horizon=40), JSON), (records.encode(), JSON),
             (rows.to_csv(index=False).encode(), CSV), (rows.to_csv().encode(), CSV),
             (rows.to_parquet(), PARQUET)]
    for body, media in cases:
        frame, params = read_body(body, media)
        expected = mlflow_frame(body, media)
        pd.testing.assert_frame_equal(validate_rows(frame), validate_rows(expected))
        assert params == ({"horizon": 40} if body == cases[0][0] else None)


@pytest.mark.parametrize(("body", "line"), [
    (b'{"dataframe_split": {"columns": ["unit"', "body: not valid JSON"),
    (b"[" * 10_000 + b"]" * 10_000, "body: JSON nested too deeply"),
    (b'{"dataframe_split": {"data": ' + b"[" * 10_000 + b"]" * 10_000 + b"}}",
     "body: JSON nested too deeply"),
    (b"[1, 2]", "body: a JSON object needs exactly one of dataframe_split or dataframe_records"),
    (b"{}", "body: a JSON object needs exactly one of dataframe_split or dataframe_records"),
    (b'{"instances": [[1, 2]]}', "body: a JSON object needs exactly one of"),
    (b'{"dataframe_split": {"data": []}, "dataframe_records": []}',
     "body: a JSON object needs exactly one of"),
    (b'{"dataframe_split": {"columns": ["<b>"]}}', "body: dataframe_split must be an object"),
    (b'{"dataframe_split": {"columns": ["a", "b"], "data": [[1, 2, 3]]}}',
     "body: dataframe_split is not a table"),
    (b'{"dataframe_records": {"a": 1}}', "body: dataframe_records must be a list"),
    (b'{"dataframe_split": {"data": []}, "params": [1]}', "params: must be a JSON object"),
    (b"\xff\xfe<script>", "body: not valid JSON"),
])
def test_a_json_body_that_is_not_rows_is_one_line(body, line):
    with pytest.raises(BodyError) as info:
        read_body(body, JSON)
    assert info.value.status == 400 and info.value.line.startswith(line)
    assert "script" not in info.value.line and "<b>" not in info.value.line


def test_a_csv_that_is_not_utf_8_or_not_a_csv_is_one_line_without_its_bytes():
    with pytest.raises(BodyError, match="^body: a CSV must be UTF-8 text$"):
        read_body(b"unit,cycle\n1,\xff\xfe<script>\n", CSV)
    with pytest.raises(BodyError, match="^body: not a CSV pandas can read"):
        read_body(b'unit,cycle\n"1,2\n', CSV)


def test_parquet_is_refused_saying_why_where_pyarrow_is_missing(monkeypatch):
    monkeypatch.setattr(bodies, "parquet_readable", lambda: False)
    for call in (lambda: read_body(ROWS.to_parquet(), PARQUET),
                 lambda: decoded_size(ROWS.to_parquet())):
        with pytest.raises(BodyError) as info:
            call()
        assert info.value.status == 415
        assert info.value.line == ("body: Parquet needs pyarrow, which this server's "
                                   "environment lacks; send JSON or CSV")


def test_a_parquet_body_is_sized_by_what_it_decodes_to():
    """Zeros compress to almost nothing: the admission reads the rows from the footer."""
    zeros = pd.DataFrame(np.zeros((200_000, 26), np.int64), columns=ROWS.columns)
    body = zeros.to_parquet()
    assert len(body) < 100_000 and decoded_size(body) >= 200_000 * 26 * 8
    with pytest.raises(BodyError, match="^body: not a Parquet file"):
        decoded_size(b"PAR1 not really")


def test_answers_are_strict_json_with_null_for_what_does_not_exist():
    frame = pd.DataFrame({"unit": [1, 2], "rul": [15.25, 3.0], "p_fail_within": [0.5, np.nan],
                          "rul_upper": [np.inf, 1.0], "padded": [False, True],
                          "flag_reason": ["", "s_9 <high> & more"]})
    text = predictions_json(frame)
    answer_ = strict(text)["predictions"]
    assert answer_[1]["p_fail_within"] is None and answer_[0]["rul_upper"] is None
    assert answer_[0] == {"unit": 1, "rul": 15.25, "p_fail_within": 0.5, "rul_upper": None,
                          "padded": False, "flag_reason": ""}
    assert b"<" not in text and b">" not in text and b"&" not in text  # escaped: \u003c
    assert answer_[1]["flag_reason"] == "s_9 <high> & more"
    finite = frame.drop(columns=["p_fail_within", "rul_upper", "flag_reason"])
    written = io.StringIO()
    scoring_server.predictions_to_json(finite, written)  # MLflow's: the same text
    assert predictions_json(finite).decode() == written.getvalue()
    assert strict(error_json("a\nb <c>", "BAD_REQUEST")) == {"error_code": "BAD_REQUEST",
                                                             "message": "a b <c>"}


def test_an_answer_written_a_block_of_records_at_a_time_is_the_same_bytes(monkeypatch):
    from rul.serving import answers

    frame = pd.DataFrame({"unit": np.arange(1, 8), "rul": np.linspace(0, 1, 7),
                          "flag_reason": ["", "a <b>", "", "", "c & d", "", ""]})
    whole = answers.predictions_json(frame)
    assert whole == answers._dumps({"predictions": frame.to_dict(orient="records")})
    for block in (1, 3, 7):
        monkeypatch.setattr(answers, "RECORDS_AT_ONCE", block)
        assert answers.predictions_json(frame) == whole
        assert answers.predictions_json(frame.head(0)) == b'{"predictions": []}'


def test_mlflow_s_refusals_become_rul_s_line_that_quotes_no_data():
    rows = "[[1, 1, -0.0007, 518.67, 641.82]]"
    cases = {
        f"Failed to enforce schema of params `{{'horizon': 'abc'}}` with signature "
        f"`['horizon': double (default: 20.0)]`. Error: Failed to convert value `abc` for "
        f"param 'horizon' {rows}": "params: horizon must be a number of cycles",
        "Invalid parameters found: {'strict': 'yes'}": "params: strict must be true or false",
        f"something else entirely {rows}\nwith lines": "input: refused by MLflow's checks",
    }
    for message, line in cases.items():
        said = refusal_line(MlflowException(message))
        assert said.startswith(line) and "518.67" not in said and "\n" not in said
    own = "input: row 2, column s_3: is not a number"
    assert refusal_line(RequestError(own)) == own


class StandIn:
    """The served pyfunc's contract (rows and params in, a frame out, RequestError for a bad
    request) around rul's predictor with a constant network and a banded interval."""

    def __init__(self):
        self.pre = Preprocessor().fit(synthetic_frame([60, 70, 55, 80], seed=3))
        guesses = np.linspace(0, 125, 200)
        self.interval = fit_banded(guesses, guesses + np.sin(guesses) * 10, 0.9, (25.0, 75.0))

    def predict(self, rows, params=None):
        try:
            model = predictor.ServedModel(self.pre, lambda w: np.full((1, len(w)), 60.0),
                                          self.interval, self.pre.envelope_)
            return predictor.predict_rows(model, rows, params=params)
        except ValueError as error:
            raise RequestError(str(error)) from None


@pytest.fixture(scope="module")
def model():
    return StandIn()


def encode(rows: pd.DataFrame, media: str) -> bytes:
    if media == JSON:
        data = rows.astype(object).to_numpy().tolist()
        return json.dumps({"dataframe_split": {"columns": list(rows.columns), "data": data}}
                          ).encode()
    return rows.to_csv(index=False).encode() if media == CSV else rows.to_parquet()


@pytest.mark.parametrize(("media", "unit"), [
    *((media, unit) for media in (JSON, CSV) for unit in (2**63, 2**64 - 1, 2**70, 0, -1)),
    *((PARQUET, unit) for unit in (2**63, 2**64 - 1, 0, -1))])  # Parquet ends at 2**64 - 1
def test_a_unit_id_int64_cannot_hold_is_refused_in_every_format(model, media, unit):
    """2**63 and up once wrapped to negative ids that merged engines (a 200 with one
    prediction for two); a Parquet file holds up to 2**64 - 1 as uint64."""
    rows = ROWS.astype({"unit": object})
    rows.loc[rows["unit"] == 2, "unit"] = unit
    if media == PARQUET:
        rows = rows.astype({"unit": np.uint64 if unit >= 2**63 else np.int64})
    result = answer(model, encode(rows, media), media)
    assert result.status == 400, result.payload
    row = int(np.argmax(ROWS["unit"].to_numpy() == 2)) + 1
    assert strict(result.payload)["message"] == (
        f"input: row {row}: unit is not a positive whole number below 2**63")


@pytest.mark.parametrize("media", [JSON, CSV])
def test_ids_past_2_53_beside_one_written_as_a_float_are_refused_not_merged(model, media):
    """2**60 and 2**60 + 1 are two engines; one unit written 5.0 made the column floats, and
    the two became one engine named 2**60, an id the client never sent."""
    rows = ROWS.astype({"unit": object})
    rows.loc[rows["unit"] == 1, "unit"] = 5.0
    rows.loc[rows["unit"] == 2, "unit"] = 2**60
    rows.loc[rows["unit"] == 3, "unit"] = 2**60 + 1
    body = encode(rows, media)
    if media == CSV:
        body = body.replace(b"\n5,", b"\n5.0,")
    result = answer(model, body, media)
    assert result.status == 400, result.payload
    row = int(np.argmax(ROWS["unit"].to_numpy() == 2)) + 1
    assert strict(result.payload)["message"] == (
        f"input: row {row}: unit is 2**53 or more in a column read as decimals (a unit written "
        "like 5.0 or 1e3): a float cannot hold it exactly; write every unit as a whole number")


class ReadsItsColumns(StandIn):
    """A model that names the columns it reads, as rul's served model does."""

    columns = list(ROWS.columns)


def test_a_parquet_body_is_read_by_the_columns_the_model_reads():
    """A column the model does not read is never decoded: one of list cells (an 18 KB file
    of 50M zeros once took 1.65 GB) costs nothing; a read one of lists is one line; a missing
    one is named as in every format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    model = ReadsItsColumns()
    table = pa.Table.from_pandas(ROWS, preserve_index=False)
    junk = table.append_column("junk", pa.array([[0.0] * 100] * len(ROWS)))
    sink = io.BytesIO()
    pq.write_table(junk, sink)
    result = answer(model, sink.getvalue(), PARQUET)
    assert result.status == 200, result.payload
    assert len(strict(result.payload)["predictions"]) == 3
    listed = table.set_column(table.schema.get_field_index("s_3"), "s_3",
                              pa.array([[1.0, 2.0]] * len(ROWS)))
    sink = io.BytesIO()
    pq.write_table(listed, sink)
    result = answer(model, sink.getvalue(), PARQUET)
    assert (result.status, strict(result.payload)["message"]) == (
        400, "body: column 's_3' holds lists or nested values; a cell is one number")
    result = answer(model, ROWS.rename(columns={"s_4": "s4"}).to_parquet(), PARQUET)
    assert strict(result.payload)["message"].startswith(
        "input: missing columns ['s_4'] (found instead ['s4'])")


@pytest.mark.parametrize("media", [JSON, CSV])
def test_a_gzip_body_is_one_line_saying_so(media):
    import gzip

    with pytest.raises(BodyError, match=f"^body: gzip-compressed; send the {media.upper()} "
                                        "uncompressed"):
        read_body(gzip.compress(encode(ROWS, media)), media)


def test_the_largest_unit_id_is_served_as_it_came(model):
    rows = ROWS.astype({"unit": np.int64})
    rows.loc[rows["unit"] == 3, "unit"] = 2**63 - 1
    for media in (JSON, CSV, PARQUET):
        result = answer(model, encode(rows, media), media)
        assert result.status == 200
        assert [p["unit"] for p in strict(result.payload)["predictions"]] == [1, 2, 2**63 - 1]


def test_every_outcome_has_its_status_and_one_line(model, monkeypatch):
    glitch = ROWS.copy()
    read = model.pre.envelope_.columns[0]  # a sensor the model reads
    glitch.loc[glitch.index[glitch["unit"] == 2][-1], read] = 1e9
    ok = answer(model, encode(glitch, JSON), JSON)
    assert ok.status == 200
    assert [p["p_fail_within"] is None for p in strict(ok.payload)["predictions"]] == [
        False, True, False]
    bad_value = ROWS.astype({"s_3": object})
    bad_value.iloc[1, bad_value.columns.get_loc("s_3")] = "<img src=x onerror=alert(1)>"
    refused = answer(model, encode(bad_value, JSON), JSON)
    assert (refused.status, strict(refused.payload)["message"]) == (
        400, "input: row 2, column s_3: is not a number")
    unknown = answer(model, split_body(ROWS, **{"x" * 5000: 1}), JSON)
    line = strict(unknown.payload)["message"]
    assert unknown.status == 400 and line.startswith("unknown parameter 'xxxxxxxxx")
    assert "x" * 41 not in line  # a name is cut to 40 characters, quotes included

    def fails(*args, **kwargs):
        raise KeyError("the rows' secret")
    monkeypatch.setattr(model, "predict", fails)
    crashed = answer(model, encode(ROWS, JSON), JSON)
    assert crashed.status == 500 and b"secret" not in crashed.payload

    def runs_out(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(model, "predict", runs_out)
    full = answer(model, encode(ROWS, JSON), JSON)
    assert full.status == 503 and full.retry_after


def test_features_made_a_block_of_units_at_a_time_are_the_same(model, monkeypatch):
    rows = synthetic_frame([40, 35, 50, 31, 90, 45], seed=8)
    whole = model.predict(rows)
    monkeypatch.setattr(predictor, "ROWS_AT_ONCE", 60)
    pd.testing.assert_frame_equal(model.predict(rows), whole, check_exact=True)


def test_windows_are_made_and_predicted_a_block_of_units_at_a_time(model, monkeypatch):
    """Each unit's window holds `window` cycles, padded: 100,000 one-row units made 336 MB of
    windows at once. Blocks of UNITS_AT_ONCE units give the same numbers."""
    rows = synthetic_frame([40, 35, 50, 31, 90, 45, 3], seed=8)
    seen = []

    def members(windows):
        seen.append(len(windows))
        return windows.sum(axis=(1, 2))[None, :] % 125  # each unit its own number

    served_model = predictor.ServedModel(model.pre, members, model.interval, model.pre.envelope_)
    whole = predictor.predict_rows(served_model, rows)
    assert seen == [7]
    monkeypatch.setattr(predictor, "UNITS_AT_ONCE", 2)
    pd.testing.assert_frame_equal(predictor.predict_rows(served_model, rows), whole,
                                  check_exact=True)
    assert seen[1:] == [2, 2, 2, 1]


def test_many_rows_validated_before_the_model_answer_the_same(model, monkeypatch):
    """Past TYPED_FIRST rows the parsed frame is validated first, so that it can go before the
    model runs: the same answers, and for rows that are wrong twice (a bad parameter and a
    bad value), the model's own order still (the parameter first)."""
    from rul.serving import scoring

    bad_value = ROWS.astype({"s_3": object})
    bad_value.iloc[1, bad_value.columns.get_loc("s_3")] = "hot"
    bodies = [encode(ROWS, JSON), encode(ROWS, CSV), split_body(ROWS, horizon=40),
              split_body(bad_value, short_history="cut"), encode(bad_value, JSON)]
    media = [JSON, CSV, JSON, JSON, JSON]
    default = [answer(model, body, m) for body, m in zip(bodies, media)]
    monkeypatch.setattr(scoring, "TYPED_FIRST", 0)
    assert [answer(model, body, m) for body, m in zip(bodies, media)] == default
    assert strict(default[3].payload)["message"] == "short_history must be one of pad, reject"


class NamesItsUnit(StandIn):
    """A model that names its unit column, as rul's served model does."""

    unit = "unit"


@pytest.mark.parametrize("media", [JSON, CSV, PARQUET])
def test_a_body_of_more_engines_than_its_size_pays_for_is_refused_before_predicting(media):
    """Each engine costs about 5 KB to predict however few its rows (its window is padded to
    the model's): 2,000 one-row engines in about 100 KB are refused, 413, with their count and
    the body's allowance; the same rows as 20 engines of 100 cycles are answered."""
    from rul.serving import admission

    one_row = pd.DataFrame(1, index=range(2_000), columns=ROWS.columns)  # every value a digit
    one_row["unit"] = np.arange(1, 2_001)
    body = encode(one_row, media)
    read = len(one_row) * 26 * 8 if media == PARQUET else len(body)
    allowed = admission.engines_allowed(media, read)
    assert admission.ENGINES_AT_LEAST <= allowed < 2_000
    predicted = []
    model = NamesItsUnit()
    model.predict = lambda rows, params=None: predicted.append(rows)
    result = answer(model, body, media)
    assert (result.status, strict(result.payload)) == (413, {
        "error_code": "REQUEST_LIMIT_EXCEEDED",
        "message": f"body: 2,000 engines in {len(body) / 2**20:.1f} MB: each takes about 5 KB to "
                   f"predict however few its rows, more than a body this size is admitted for "
                   f"({allowed:,} engines); send fewer engines per request"})
    assert not predicted
    one_row["unit"] = np.arange(2_000) // 100 + 1
    one_row["cycle"] = np.arange(2_000) % 100 + 1
    assert answer(NamesItsUnit(), encode(one_row, media), media).status == 200

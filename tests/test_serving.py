"""`make serve` (mlflow models serve -m models:/rul-fd001@champion): good answers, one clear
line for every bad request, the server stays up.

One server (the tiny logged model of test_inference.py, registered as the champion) answers
every request of this module: `make serve` itself, with the project's environment off PATH
(as a user who has not activated it), on a free port; it is stopped at the end.
"""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import wait_until_answering
from mlflow.exceptions import MlflowException
from test_inference import CHAMPION_URI, ROOT, log_tiny_model
from test_intervals import banded_interval

from rul.data.schema import COLUMNS

pytestmark = pytest.mark.slow

MAX_BODY = 300  # characters of a 400's whole JSON body
LIMIT_MB = 8  # the module server's body limit (--max-body-mb)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def split_payload(rows: pd.DataFrame, **params) -> dict:
    """The dataframe_split body a client sends: column names and row lists."""
    split = json.loads(rows.to_json(orient="split", index=False))
    body = {"dataframe_split": {"columns": split["columns"], "data": split["data"]}}
    return {**body, "params": params} if params else body


@pytest.fixture(scope="module")
def server(tmp_path_factory, fd001):
    root = tmp_path_factory.mktemp("serving")
    uri = f"sqlite:///{root}/mlflow.db"
    patch = pytest.MonkeyPatch()
    patch.chdir(root)
    mlflow.set_tracking_uri(uri)
    try:
        log_tiny_model(fd001, root / "work", interval=banded_interval())
        model = mlflow.pyfunc.load_model(CHAMPION_URI)
    finally:
        mlflow.set_tracking_uri(None)
        patch.undo()
    port = _free_port()
    venv = Path(sys.executable).parent.parent
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if Path(p).resolve() != (venv / "bin").resolve())
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": path}
    env.pop("VIRTUAL_ENV", None)
    log = open(root / "serve.log", "wb")  # noqa: SIM115 (closed below)
    stamp = venv / ".installed"  # `make -o`: never reinstall here
    process = subprocess.Popen(
        ["make", "-C", str(ROOT), "-o", str(stamp), "serve", f"VENV={venv}", f"PORT={port}",
         f"MODEL={CHAMPION_URI}", f"STAMP={stamp}", f"SERVE_ARGS=--max-body-mb {LIMIT_MB}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(process, f"{base}/ping", root / "serve.log", 120)
        yield SimpleNamespace(base=base, model=model, process=process, log=root / "serve.log",
                              uri=uri)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()


def post(server, body: bytes | str | dict, content_type: str = "application/json"
         ) -> tuple[int, str]:
    """(status, the body as text)."""
    if isinstance(body, dict):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(f"{server.base}/invocations", data=data,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def predictions(server, body, content_type="application/json") -> list[dict]:
    status, text = post(server, body, content_type)
    assert status == 200, text
    return json.loads(text)["predictions"]


def test_valid_payload_answers_like_the_in_process_model(server, fd001):
    rows = fd001.test[fd001.test["unit"].isin([1, 2])]
    answer = predictions(server, split_payload(rows))
    expected = server.model.predict(rows)
    assert [p["unit"] for p in answer] == [1, 2]
    assert [p["padded"] for p in answer] == [False, False]
    assert [p["flagged"] for p in answer] == [False, False]
    assert [p["flag_reason"] for p in answer] == ["", ""]
    np.testing.assert_allclose([p["rul"] for p in answer], expected["rul"], atol=1e-9)


def test_integer_sensors_and_float_ids_are_accepted(server, fd001):
    rows = fd001.test[fd001.test["unit"].isin([1, 2])].copy()
    as_users_read = rows.astype({"s_17": np.int64, "s_18": np.int64, "unit": float})
    answer = predictions(server, split_payload(as_users_read))
    assert [p["rul"] for p in answer] == pytest.approx(
        server.model.predict(rows)["rul"].tolist(), abs=1e-9)


@pytest.mark.parametrize("index", [True, False])
def test_csv_bodies_work_as_mlflow_documents_them(server, fd001, index):
    """text/csv as written by DataFrame.to_csv() (the index as an extra first column, or
    none), columns in any order: the same predictions as JSON."""
    rows = fd001.test[fd001.test["unit"].isin([1, 2, 3])]
    csv = rows[COLUMNS[::-1]].to_csv(index=index)
    answer = predictions(server, csv, "text/csv")
    assert [p["unit"] for p in answer] == [1, 2, 3]
    assert [p["rul"] for p in answer] == pytest.approx(
        [p["rul"] for p in predictions(server, split_payload(rows))], abs=1e-9)


def test_short_history_is_flagged_or_rejected_on_request(server, fd001):
    rows = fd001.test[fd001.test["unit"] == 1].head(5)
    answer = predictions(server, split_payload(rows))
    assert answer[0]["padded"] is True and answer[0]["flagged"] is True
    assert answer[0]["flag_reason"] == "5-row history, shorter than the window (30)"
    status, text = post(server, split_payload(rows, short_history="reject"))
    assert status == 400
    assert json.loads(text)["message"] == (
        "input: history shorter than the window (30 cycles): unit 1 has 5 rows")


def test_failure_probability_for_the_requested_horizon(server, fd001):
    rows = fd001.test[fd001.test["unit"].isin([1, 2, 3])]
    answer = predictions(server, split_payload(rows))
    default = server.model.predict(rows)
    np.testing.assert_allclose([p["p_fail_within"] for p in answer], default["p_fail_within"],
                               atol=1e-12)
    later = predictions(server, split_payload(rows, horizon=60))
    expected = server.model.predict(rows, params={"horizon": 60.0})["p_fail_within"]
    np.testing.assert_allclose([p["p_fail_within"] for p in later], expected, atol=1e-12)
    assert not np.allclose(expected, default["p_fail_within"])
    status, text = post(server, split_payload(rows, horizon=500))
    assert status == 400 and len(text) < MAX_BODY
    assert json.loads(text)["message"] == ("horizon must be a number of cycles between 0 and "
                                           "the model's RUL cap (125), exclusive")


def _rows(fd001, units=(1, 2)):
    return fd001.test[fd001.test["unit"].isin(units)].reset_index(drop=True)


def _glitch(fd001):
    rows = _rows(fd001)
    rows.loc[rows.index[rows["unit"] == 2][3], "s_9"] = 1e9
    return rows


def _with_value(fd001, column, value):
    rows = _rows(fd001).astype({column: object})
    rows.iloc[1, rows.columns.get_loc(column)] = value
    return rows


# What a served FD001 model asks of the rows: the 19 columns it reads; the seven sensors it does
# not read (constant in FD001) a body may leave out.
READS = ("unit, cycle, setting_1..setting_3, s_2..s_4, s_7..s_9, s_11..s_15, s_17, s_20, s_21 "
         "(7 others optional)")

BAD_REQUESTS = {
    "renamed column": (
        lambda fd: split_payload(_rows(fd).rename(columns={"s_4": "s4"})),
        f"input: missing columns ['s_4'] (found instead ['s4']); expected {READS}"),
    "missing column": (
        lambda fd: split_payload(_rows(fd).drop(columns=["s_9"])),
        f"input: missing columns ['s_9']; expected {READS}"),
    "other columns": (
        lambda fd: {"dataframe_split": {"columns": ["a", "b"], "data": [[1, 2]]}},
        f"input: missing all 19 columns (found instead ['a', 'b']); expected {READS}"),
    "empty list": (
        lambda fd: {"dataframe_split": {"columns": [], "data": []}},
        f"input: missing all 19 columns; expected {READS}"),
    "no rows": (lambda fd: {"dataframe_split": {"columns": COLUMNS, "data": []}},
                "input: no rows"),
    "non-numeric value": (lambda fd: split_payload(_with_value(fd, "s_3", "hot")),
                          "input: row 2, column s_3: is not a number"),
    "a long value": (lambda fd: split_payload(_with_value(fd, "s_3", "<x>" * 5000)),
                     "input: row 2, column s_3: is not a number"),
    "missing value": (lambda fd: split_payload(_with_value(fd, "s_3", None)),
                      "input: row 2, column s_3: is missing"),
    "unknown parameter": (lambda fd: split_payload(_rows(fd), shorthistory="reject"),
                          "unknown parameter 'shorthistory'; allowed: short_history, strict, "
                          "horizon"),
    "bad parameter value": (lambda fd: split_payload(_rows(fd), short_history="cut"),
                            "short_history must be one of pad, reject"),
    "a long parameter name": (lambda fd: split_payload(_rows(fd), **{"<p>" * 300: 1}),
                              "unknown parameter '<p><p><p><p><p><p><p><p><p><p><p><p>..."),
    "strict refusal": (lambda fd: split_payload(_glitch(fd), strict=True),
                       "input: outside the training fleet (strict): unit 2 (s_9 "),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_requests_get_one_line_of_rul_and_the_server_stays_up(server, fd001, name):
    make_body, message = BAD_REQUESTS[name]
    status, text = post(server, make_body(fd001))
    assert status == 400, (name, status, text)
    assert len(text) < MAX_BODY, (name, len(text), text)
    answer = json.loads(text)
    assert answer["message"].startswith(message), (name, answer["message"])
    assert "\n" not in answer["message"] and "Failed to predict" not in text
    assert "Traceback" not in text and "stack_trace" not in answer
    assert "<" not in text and "hot" not in text  # escaped (\u003c), and no value quoted
    status, _ = post(server, split_payload(fd001.test[fd001.test["unit"] == 3]))
    assert status == 200 and server.process.poll() is None


def test_bad_csv_value_gets_the_same_line(server, fd001):
    status, text = post(server, _with_value(fd001, "s_3", "hot").to_csv(index=False),
                        "text/csv")
    assert status == 400 and len(text) < MAX_BODY
    assert json.loads(text)["message"] == "input: row 2, column s_3: is not a number"


def test_a_csv_without_its_header_gets_one_answer_on_every_path(server, fd001, tmp_path):
    """HTTP and `rul predict`'s reader refuse a header-less CSV with the same line; the model
    in Python (the body read as pandas reads a CSV) is handed none of its columns by MLflow
    (none is declared), and says all are missing."""
    from rul.data.errors import DataError
    from rul.data.reader import read_input
    from rul.data.validation import NO_HEADER, validate_rows

    csv = fd001.test[fd001.test["unit"] <= 2].to_csv(index=False, header=False)
    status, text = post(server, csv, "text/csv")
    assert status == 400 and len(text) < MAX_BODY, text
    assert json.loads(text)["message"] == f"input: {NO_HEADER}"
    with pytest.raises(MlflowException) as info:
        server.model.predict(pd.read_csv(io.StringIO(csv)))
    assert info.value.message == DECLARED_ONLY["a CSV without its header"]
    (tmp_path / "bare.csv").write_text(csv)
    with pytest.raises(DataError) as info:  # as rul predict reads it and the model checks it
        validate_rows(read_input(tmp_path / "bare.csv"), tmp_path / "bare.csv")
    assert str(info.value) == f"{tmp_path / 'bare.csv'}: {NO_HEADER}"


def test_outside_the_fleet_is_flagged_without_strict(server, fd001):
    answer = predictions(server, split_payload(_glitch(fd001)))
    assert [p["flagged"] for p in answer] == [False, True]
    assert answer[1]["flag_reason"].startswith("s_9 ")


RAW_BAD = {  # bodies MLflow's scoring server refuses before the model sees them
    "not JSON": (b'{"dataframe_split": {"columns": ["unit"', "body: not valid JSON"),
    "{}": (b"{}", "body: a JSON object needs exactly one of dataframe_split or "
                  "dataframe_records"),
    "empty": (b"", "body: empty"),
    "a list": (b"[1, 2]", "body: "),
    "horizon 'abc'": (None, "horizon must be a number of cycles between 0 and the model's RUL cap"),
    "strict 'yes'": (None, "strict must be true or false"),
}


@pytest.mark.parametrize("name", list(RAW_BAD))
def test_every_400_is_one_line_that_quotes_no_data(server, fd001, name):
    body, line = RAW_BAD[name]
    if body is None:
        key, value = name.split(" ")
        body = split_payload(_rows(fd001), **{key: value.strip("'")})
    status, text = post(server, body)
    assert status == 400 and len(text) < MAX_BODY, (name, status, text)
    message = json.loads(text)["message"]
    assert message.startswith(line) and "\n" not in message, (name, message)
    assert "518.67" not in text and "641." not in text  # no sensor value of the rows
    status, _ = post(server, split_payload(fd001.test[fd001.test["unit"] == 3]))
    assert status == 200 and server.process.poll() is None


def test_a_body_over_the_limit_is_413_declared_or_streamed(server, fd001):
    import http.client

    big = b"{" + b" " * (LIMIT_MB * 2**20) + b"}"
    status, text = post(server, big)
    assert status == 413 and json.loads(text)["message"].startswith(
        f"body: larger than this server's limit of {LIMIT_MB} MB")
    port = int(server.base.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    chunks = (b" " * 2**20 for _ in range(LIMIT_MB + 1))  # no Content-Length: chunked
    connection.request("POST", "/invocations", body=chunks, encode_chunked=True,
                       headers={"Content-Type": "application/json"})
    assert connection.getresponse().status == 413
    connection.close()
    status, _ = post(server, split_payload(fd001.test[fd001.test["unit"] == 3]))
    assert status == 200 and server.process.poll() is None


def test_a_long_refusal_names_what_fits_and_keeps_its_count():
    """Seven flagged engines with long reasons: the strict refusal names as many as fit in
    its budget and always ends with how many more there are (the 400 is cut at 180)."""
    from rul.serving.predictor import REFUSAL_CHARS, refusal
    from rul.serving.request_errors import MAX_LINE, one_line

    reason = "s_9 at 1e+09, 52 fleet standard deviations above the fleet's range; a late start"
    units = list(range(1, 8))
    text = refusal(units, [reason] * 7, [True] * 7)
    assert len(text) <= REFUSAL_CHARS and text.startswith("outside the training fleet")
    assert text.endswith("; and 6 more") and "unit 1 (" in text
    short = refusal(units, ["s_9"] * 7, [True] * 7)
    assert short.endswith("; and 2 more") and "unit 5 (s_9)" in short
    assert refusal([4], ["s_9"], [True]) == "outside the training fleet (strict): unit 4 (s_9)"
    assert one_line(f"input: {text}").endswith("more") and len(f"input: {text}") <= MAX_LINE


# ------------------------------------------------------------------ one answer on every path

DOC = ROOT / "docs" / "guides" / "serve.md"
TABLE_START, TABLE_END = "<!-- paths: generated by tests/test_serving.py -->", "<!-- paths end -->"


def _duplicate_cycle(fd001):
    rows = _rows(fd001)
    rows.loc[3, "cycle"] = rows.loc[2, "cycle"]
    return rows


def _unit(value):
    """Rows whose engine 2 is sent as unit `value` (a Python int: exact however large)."""
    def make(fd001):
        rows = _rows(fd001).astype({"unit": object})
        rows.loc[rows["unit"] == 2, "unit"] = value
        return rows
    return make


PATH_CASES = {  # what a caller sends: rows, and the request's params (the CLI's flags)
    "valid rows": (_rows, {}),
    "a sensor beyond the fleet": (_glitch, {}),
    "the same, strict": (_glitch, {"strict": True}),
    "a renamed column (s4)": (lambda fd: _rows(fd).rename(columns={"s_4": "s4"}), {}),
    "a text value": (lambda fd: _with_value(fd, "s_3", "hot"), {}),
    "a missing value": (lambda fd: _with_value(fd, "s_3", None), {}),
    "a repeated cycle": (_duplicate_cycle, {}),
    "a short history, rejected": (lambda fd: _rows(fd).groupby("unit").head(5),
                                  {"short_history": "reject"}),
    "horizon 500": (_rows, {"horizon": 500.0}),
    "a CSV without its header": (_rows, {"csv_header": False}),
    "a unit of 2**63 (past int64)": (_unit(2**63), {}),
    "a unit of 2**70": (_unit(2**70), {}),
    "a unit of 0": (_unit(0), {}),
    "the largest unit, 2**63 - 1": (_unit(2**63 - 1), {}),
}


# MLflow hands model.predict only the columns the signature declares (it drops the others with
# a warning), so there a line cannot name the columns found instead of the model's.
DECLARED_ONLY = {
    "a renamed column (s4)": f"input: missing columns ['s_4']; expected {READS}",
    "a CSV without its header": f"input: missing all 19 columns; expected {READS}",
}


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as JavaScript's JSON.parse does."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _answers(server, fd001, tmp_path, name) -> dict:
    """Each path's answer to one case: 'ok' (flagged units named) or its one line, with the
    CLI's file name put back to 'input'."""
    from click.testing import CliRunner

    from rul.cli import main

    make_rows, params = PATH_CASES[name]
    params = dict(params)
    header = params.pop("csv_header", True)
    rows = make_rows(fd001)
    csv = rows.to_csv(index=False, header=header)

    def ok(frame) -> str:
        flagged = [int(u) for u in np.asarray(frame["unit"])[np.asarray(frame["flagged"])]]
        return "ok" + (f", flagged: unit {', '.join(map(str, flagged))}" if flagged else "")

    if header:
        status, text = post(server, split_payload(rows, **params))
    else:
        status, text = post(server, csv, "text/csv")
    answer = strict_json(text)  # every answer: strict JSON
    http = ok(pd.DataFrame(answer["predictions"])) if status == 200 else answer["message"]
    try:
        frame = pd.read_csv(io.StringIO(csv)) if not header else rows
        python = ok(server.model.predict(frame, params=params or None))
    except MlflowException as error:
        python = error.message
    path = tmp_path / f"{name.replace(' ', '_')}.csv"
    path.write_text(csv)
    flags = [*(["--strict"] if params.get("strict") else []),
             *(["--short-history", params["short_history"]] if "short_history" in params else []),
             *(["--horizon", str(params["horizon"])] if "horizon" in params else [])]
    done = CliRunner().invoke(main, ["predict", "--model", CHAMPION_URI, "--tracking-uri",
                                     server.uri, "--input", str(path), *flags])
    if done.exit_code == 0:
        cli = ok(pd.read_csv(io.StringIO(done.stdout)))
    else:
        cli = done.output.strip().splitlines()[-1].removeprefix("Error: ")
        cli = cli.replace(f"{path}: ", "input: ")
    return {"rul predict": (done.exit_code, cli), "model.predict": python,
            "HTTP": (status, http)}


def test_every_path_gives_the_same_answer_and_the_guide_shows_it(server, fd001, tmp_path):
    """rul predict (a CSV file), model.predict (the served pyfunc in Python) and HTTP
    (the guarded server) answer each case with the same line; the serve guide's table is this
    test's output (RUL_WRITE_DOCS=1 rewrites it)."""
    lines = ["| input | `rul predict` | `model.predict` | HTTP | the answer, on every path |",
             "| --- | --- | --- | --- | --- |"]
    for name in PATH_CASES:
        answers = _answers(server, fd001, tmp_path, name)
        (code, cli), python, (status, http) = answers.values()
        assert cli == http and python == DECLARED_ONLY.get(name, cli), (name, answers)
        refused = cli != "ok" and not cli.startswith("ok,")
        assert (code, status) == ((2, 400) if refused else (0, 200)), (name, answers)
        said = ("exit 2", "raises", "400") if refused else ("exit 0", "returns", "200")
        own = f"; `model.predict`: `{python}`" if python != cli else ""
        lines.append(f"| {name} | {' | '.join(said)} | `{cli}`{own} |")
    table = "\n".join(lines)
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    if os.environ.get("RUL_WRITE_DOCS") == "1":
        DOC.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    assert text[start:end].strip() == table, "serve.md's table: run with RUL_WRITE_DOCS=1"


@pytest.mark.parametrize("unit", [2**63, 2**64 - 1])
def test_a_unit_past_int64_gets_the_same_line_as_csv_and_parquet(server, fd001, unit):
    """The JSON line of the table, for the same rows as CSV and as Parquet (uint64, which
    once answered as unit -1)."""
    rows = _unit(unit)(fd001)
    line = "input: row 32: unit is not a positive whole number below 2**63"
    assert rows.index[rows["unit"] == unit][0] == 31
    for body, content_type in (
            (rows.to_csv(index=False), "text/csv"),
            (rows.astype({"unit": np.uint64}).to_parquet(), "application/vnd.apache.parquet")):
        status, text = post(server, body, content_type)
        assert (status, strict_json(text)["message"]) == (400, line), content_type


def test_a_hundred_engines_answer_as_the_model_in_python_in_every_format(server, fd001):
    """FD001's test set (a body over 1 MiB: answered by the worker process), the same
    numbers as model.predict to the last digit, as JSON, CSV and Parquet."""
    expected = server.model.predict(fd001.test)
    for body, content_type in ((json.dumps(split_payload(fd001.test)), "application/json"),
                               (fd001.test.to_csv(index=False), "text/csv"),
                               (fd001.test.to_parquet(), "application/vnd.apache.parquet")):
        status, text = post(server, body, content_type)
        assert status == 200, text
        served = pd.DataFrame(strict_json(text)["predictions"])
        pd.testing.assert_frame_equal(served, expected, check_dtype=False, check_exact=True)


def _raw(server, method: str, path: str, headers: dict | None = None, body: bytes = b""
         ) -> tuple[int, dict, str]:
    import http.client

    port = int(server.base.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body or None, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def test_untidy_requests_get_their_status_and_one_line(server, fd001):
    """Other methods, no Content-Type, another one, JSON nested 10,000 deep, the API docs,
    a trailing slash: each its status and one JSON line; the server keeps serving."""
    for method in ("GET", "HEAD", "OPTIONS", "TRACE", "PUT"):
        status, headers, text = _raw(server, method, "/invocations")
        assert status == 405 and headers["allow"] == "POST", method
        if method != "HEAD":
            assert strict_json(text)["message"] == "method: /invocations takes POST"
    body = json.dumps(split_payload(_rows(fd001))).encode()
    status, _, text = _raw(server, "POST", "/invocations", {}, body)
    assert status == 400 and strict_json(text)["message"].startswith(
        "headers: Content-Type is missing")
    hostile = "text/<script>alert(1)</script>"
    status, _, text = _raw(server, "POST", "/invocations", {"Content-Type": hostile}, body)
    assert status == 415 and "script" not in text and len(text) < MAX_BODY
    deep = b"[" * 10_000 + b"]" * 10_000
    status, text = post(server, deep)
    assert status == 400 and strict_json(text)["message"].startswith(
        "body: JSON nested too deeply")
    for path in ("/docs", "/redoc", "/openapi.json", "/invocations/"):
        status, headers, text = _raw(server, "GET", path, {"Host": "evil.example"})
        assert status == 404 and "location" not in {k.lower() for k in headers}, path
    status, _ = post(server, split_payload(fd001.test[fd001.test["unit"] == 3]))
    assert status == 200 and server.process.poll() is None

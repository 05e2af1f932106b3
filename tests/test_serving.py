"""`mlflow models serve -m models:/rul-fd001@champion`: good answers, clear 4xx, server stays up.

One server (the tiny logged model of test_inference.py, registered as the champion) answers
every request of this module; it is started once and stopped at the end.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
from test_inference import CHAMPION_URI, log_tiny_model
from test_intervals import banded_interval

from rul.data.schema import COLUMNS

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def split_payload(rows: pd.DataFrame) -> dict:
    """The dataframe_split body a client sends: column names and row lists."""
    split = json.loads(rows.to_json(orient="split", index=False))
    return {"dataframe_split": {"columns": split["columns"], "data": split["data"]}}


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
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(root / "serve.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", CHAMPION_URI,
         "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, (root / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{base}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, "server did not answer /ping within 90 s"
            time.sleep(1)
        yield SimpleNamespace(base=base, model=model, process=process, log=root / "serve.log")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()


def post(server, body: bytes | str | dict) -> tuple[int, dict]:
    if isinstance(body, dict):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    request = urllib.request.Request(f"{server.base}/invocations", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_valid_payload_answers_like_the_in_process_model(server, fd001):
    rows = fd001.test[fd001.test["unit"].isin([1, 2])]
    status, answer = post(server, split_payload(rows))
    assert status == 200, answer
    expected = server.model.predict(rows)
    predictions = answer["predictions"]
    assert [p["unit"] for p in predictions] == [1, 2]
    assert [p["padded"] for p in predictions] == [False, False]
    np.testing.assert_allclose([p["rul"] for p in predictions], expected["rul"], atol=1e-9)


def test_integer_sensors_and_float_ids_are_accepted(server, fd001):
    rows = fd001.test[fd001.test["unit"].isin([1, 2])].copy()
    as_users_read = rows.astype({"s_17": np.int64, "s_18": np.int64, "unit": float})
    status, answer = post(server, split_payload(as_users_read))
    assert status == 200, answer
    assert [p["rul"] for p in answer["predictions"]] == pytest.approx(
        server.model.predict(rows)["rul"].tolist(), abs=1e-9)


def test_short_history_is_flagged_or_rejected_on_request(server, fd001):
    rows = fd001.test[fd001.test["unit"] == 1].head(5)
    status, answer = post(server, split_payload(rows))
    assert status == 200 and answer["predictions"][0]["padded"] is True
    status, answer = post(server, {**split_payload(rows), "params": {"short_history": "reject"}})
    assert status == 400
    assert "unit 1 has 5 rows" in answer["message"]


def test_failure_probability_for_the_requested_horizon(server, fd001):
    rows = fd001.test[fd001.test["unit"].isin([1, 2, 3])]
    status, answer = post(server, split_payload(rows))
    assert status == 200, answer
    default = server.model.predict(rows)
    np.testing.assert_allclose([p["p_fail_within"] for p in answer["predictions"]],
                               default["p_fail_within"], atol=1e-12)
    status, later = post(server, {**split_payload(rows), "params": {"horizon": 60}})
    assert status == 200, later
    expected = server.model.predict(rows, params={"horizon": 60.0})["p_fail_within"]
    np.testing.assert_allclose([p["p_fail_within"] for p in later["predictions"]], expected,
                               atol=1e-12)
    assert not np.allclose(expected, default["p_fail_within"])
    status, refused = post(server, {**split_payload(rows), "params": {"horizon": 500}})
    assert status == 400
    assert "horizon must be a number of cycles between 0 and the model's RUL cap (125)" in \
        refused["message"]


@pytest.mark.parametrize(
    ("name", "body", "problem"),
    [
        ("malformed JSON", '{"dataframe_split": {"columns": ["unit"', "Invalid input"),
        ("wrong columns", {"dataframe_split": {"columns": ["a", "b"], "data": [[1, 2]]}},
         "missing inputs"),
        ("empty list", {"dataframe_split": {"columns": [], "data": []}}, "missing inputs"),
        ("no rows", {"dataframe_split": {"columns": COLUMNS, "data": []}}, "input: no rows"),
        ("instances: empty list", {"instances": []}, "missing inputs"),
        ("non-numeric value", None, "row 2, column s_3: 'hot' is not a number"),
    ],
)
def test_bad_requests_get_a_clear_4xx_and_the_server_stays_up(server, fd001, name, body,
                                                             problem):
    if body is None:
        rows = fd001.test[fd001.test["unit"] == 1].head(3).astype({"s_3": object})
        rows.iloc[1, rows.columns.get_loc("s_3")] = "hot"
        body = split_payload(rows)
    status, answer = post(server, body)
    assert 400 <= status < 500, (name, status, answer)
    assert problem in answer["message"], (name, answer["message"][-500:])
    assert "Traceback" not in answer["message"]
    status, _ = post(server, split_payload(fd001.test[fd001.test["unit"] == 3]))
    assert status == 200 and server.process.poll() is None

"""`make ui` is light and stops at Ctrl-C with every process it started, within seconds, even
when it was started with SIGINT ignored (a background job of a non-interactive shell, as some
CI runners start the tests): the wrapper (python -m rul.tracking.ui) handles SIGINT itself. It
runs one web worker and no job consumers, says no deprecation or telemetry lines, prints the
experiments' addresses once it answers and ends with exit 0. No browser needed."""

import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow

STOP_S = 5.0


def test_the_ui_is_light_quiet_and_stops_within_seconds_though_sigint_was_ignored(
        tmp_path, mlflow_ui, mlflow_store_at):
    started, stopped = [], {}
    with mlflow_store_at(tmp_path) as store, mlflow_ui(store, started, stopped) as base:
        with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
            assert response.status == 200
        log = store.root / "ui.log"
        deadline = time.monotonic() + 120
        while "MLflow UI ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
    commands = [command for _, command in started]
    assert len(commands) == 2, commands  # `mlflow ui` and one web worker (uvicorn)
    assert not any("huey" in command for command in commands)  # no job consumers
    assert stopped["returncode"] == 0  # stopped as asked: make adds no "Error 130"
    assert stopped["seconds"] < STOP_S, stopped
    said = log.read_text()
    lines = said.splitlines()
    ready = lines.index("MLflow UI ready (Ctrl-C stops it):")
    # a new store holds MLflow's Default experiment only: its runs, Model training view
    assert lines[ready + 1] == (f"experiment Default: {base}/#/experiments/0"
                                "?workflowType=machine_learning")
    assert "Warning" not in said and "telemetry" not in said.lower(), said
    assert " - \"GET " not in said  # no line per request

"""`make ui` stops at Ctrl-C with every process it started, even when it was started with
SIGINT ignored (a background job of a non-interactive shell, as some CI runners start the
tests): the wrapper (python -m rul.tracking.ui) handles SIGINT itself. No browser needed."""

import urllib.request

import pytest

pytestmark = pytest.mark.slow


def test_ctrl_c_stops_the_ui_and_its_workers_though_sigint_was_ignored(tmp_path, mlflow_ui,
                                                                         mlflow_store_at):
    started = []
    with mlflow_store_at(tmp_path) as store, mlflow_ui(store, started) as base, \
            urllib.request.urlopen(f"{base}/health", timeout=10) as response:
        assert response.status == 200
    assert started  # the server it ran; the serve fixture checks that nothing outlived it

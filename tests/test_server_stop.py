"""The server stopped as a service manager or a container stops it: SIGTERM to its process
alone (a container's first process) or to its whole group (systemd's default), after it has
answered. It shuts down, says `stopped`, exits 0, and leaves no process and nothing in the
temporary folder behind (its scratch folder and the fork server's). Its TMPDIR is longer than
a Unix socket's path allows the fork server's socket, as a deep CI or container folder is."""

import os
import signal
import time

import pytest
from test_inference import tiny_model_folder

from bench.serving import Server, descendants, one_engine, post

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, fd001):
    return tiny_model_folder(fd001, tmp_path_factory.mktemp("stop"))


@pytest.mark.parametrize("to_group", [False, True], ids=["the process", "its group"])
def test_sigterm_stops_the_server_cleanly_and_leaves_nothing(model_folder, fd001, tmp_path,
                                                             to_group):
    scratch = tmp_path / ("tmp" * 30)
    scratch.mkdir()
    server = Server(model_folder, env={**os.environ, "TMPDIR": str(scratch)}).start(tmp_path)
    try:
        assert post(server.base, one_engine(fd001.test))[0] == 200
        started = descendants(server.process.pid)
        assert len(started) >= 2 and list(scratch.iterdir()), started  # a worker, scratch
        if to_group:
            os.killpg(server.process.pid, signal.SIGTERM)
        else:
            server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=30)
    finally:
        server.stop()
    said = server.log.read_text()
    assert code == 0 and said.splitlines()[-1] == "stopped" and "Traceback" not in said, said
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in started[1:]) and (
            time.monotonic() < deadline):
        time.sleep(0.1)
    left = [pid for pid in started[1:] if os.path.exists(f"/proc/{pid}")]
    assert not left, left
    assert sorted(p.name for p in scratch.iterdir()) == []

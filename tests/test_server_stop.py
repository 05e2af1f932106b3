"""The server stopped as a service manager or a container stops it: SIGTERM to its process
alone (a container's first process) or to its whole group (systemd's default), after it has
answered. It shuts down, says `stopped`, exits 0, and leaves no process and nothing in the
temporary folder behind (its scratch folder and the fork server's). Its TMPDIR is longer than
a Unix socket's path allows the fork server's socket, as a deep CI or container folder is."""

import os
import shutil
import signal
import time
from pathlib import Path

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


def test_a_server_killed_outright_leaves_no_worker_and_no_folder(model_folder, fd001, tmp_path):
    """SIGKILL (the out-of-memory killer's, or `kill -9`) runs none of the server's clean-up:
    its worker watches it (rul.orphans), removes the server's scratch folder and the fork
    server's, and ends; the fork server ends with the server. They once stayed, with both
    folders."""
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))  # short: the fork server's
    try:                                                        # folder is made in it too
        server = Server(model_folder, env={**os.environ, "TMPDIR": str(scratch)}).start(
            tmp_path)
        try:
            assert post(server.base, one_engine(fd001.test))[0] == 200
            started = descendants(server.process.pid)
            assert len(started) >= 3, started  # the server, its fork server, its worker
            assert sorted(p.name[:5] for p in scratch.iterdir()) == ["pymp-", "rul-s"]
            server.process.kill()
            server.process.wait(timeout=30)
        finally:
            server.stop()
        deadline = time.monotonic() + 15
        while any(_running(pid) for pid in started[1:]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in started[1:] if _running(pid)] == []
        assert list(scratch.iterdir()) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _running(pid: int) -> bool:
    """Neither ended nor a zombie no one reaps (a container's first process may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

"""`make serve` on a port that is taken: one line naming the port and how to choose another,
at once (before the model loads), exit 2, and no `serving` line. (The `serving` line, printed
once uvicorn serves the bound sockets, is what the serving tests wait for.)"""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rul.serving.listening import CannotListen, bound_sockets

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def taken_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield holder.getsockname()[1]
    holder.close()


def test_a_taken_port_is_one_line_before_the_model_loads(taken_port, tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rul.serving.server", str(tmp_path / "no-model"),
                           "--port", str(taken_port)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - started
    said = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2, said
    assert said == [f"error: port {taken_port} on 127.0.0.1 is already in use (another server, "
                    f"or make ui); choose another with --port (make serve PORT={taken_port + 1})"]
    assert took < 30  # the model (here none) is never looked at


def test_a_free_port_is_held_from_the_start():
    (sock,) = bound_sockets("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        with pytest.raises(CannotListen, match=f"port {port} on 127.0.0.1 is already in use"):
            bound_sockets("127.0.0.1", port)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # waits in the backlog
    finally:
        sock.close()


def test_a_host_that_is_not_this_machines_is_one_line():
    with pytest.raises(CannotListen, match="choose another with --host"):
        bound_sockets("192.0.2.1", 0)  # TEST-NET-1: no machine's own address
    with pytest.raises(CannotListen, match="host 'no such host' is not a name"):
        bound_sockets("no such host", 0)

"""Connections that cannot hold the server (rul.serving.connections): uvicorn with rul's h11
protocol, serving a trivial app on 127.0.0.1 with short limits, met by raw sockets that send
headers that never end, a body a trickle at a time or with no end, nothing at all, too many
connections, and an answer never read. Each is cut off in time with one JSON line (408, 503
with Retry-After); and the log says each kind once per interval (rul.serving.refusal_log)."""

import json
import logging
import socket
import threading
import time

import pytest
import uvicorn

from rul.serving.connections import protocol
from rul.serving.limits import Limits
from rul.serving.refusal_log import Throttle

GRACE = 0.5  # --header-timeout (the body's grace and the write deadline too)
CAP = 6


async def app(scope, receive, send):
    """Reads the body; answers its length, or 20 MB for /big."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"x" * 20 * 2**20 if scope["path"] == "/big" else str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    limits = Limits(header_timeout=GRACE, min_rate_kb=64, keep_alive=GRACE,
                    max_connections=CAP)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol(limits),
                            timeout_keep_alive=limits.keep_alive, log_config=None,
                            lifespan="off")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.05)
    yield port
    served.should_exit = True
    thread.join(10)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def answer_of(sock: socket.socket) -> tuple[int, dict, bytes, float]:
    """(status, headers, body, seconds) of what the server writes until it closes."""
    started, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body, time.monotonic() - started


def request(port: int, body: bytes = b"{}") -> int:
    with connect(port) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        return answer_of(sock)[0]


def test_headers_that_never_end_and_silence_are_408_after_the_header_deadline(server):
    for sent in (b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Slow: ", b""):
        with connect(server) as sock:
            sock.sendall(sent)
            status, headers, body, seconds = answer_of(sock)
        assert status == 408 and GRACE * 0.8 <= seconds < GRACE + 1.5, seconds
        assert json.loads(body)["message"] == f"headers: not complete within {GRACE:g} s"
        assert headers["connection"] == "close"
    assert request(server) == 200


def test_a_body_slower_than_the_minimum_rate_is_408_declared_or_chunked(server):
    heads = (b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 500000000\r\n\r\n",
             b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for head in heads:
        with connect(server) as sock:
            sock.sendall(head)
            started = time.monotonic()
            status = None
            try:
                while time.monotonic() - started < 10:  # 1 kB every 0.1 s: 10 kB/s
                    sock.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n" if b"chunked" in head
                                 else b"x" * 1024)
                    time.sleep(0.1)
            except OSError:  # the server closed it
                pass
            status, _, body, _ = answer_of(sock)
            seconds = time.monotonic() - started
        assert status == 408 and GRACE <= seconds < GRACE + 3, seconds
        assert json.loads(body)["message"] == "body: arrived slower than 64 KB/s"
    with connect(server) as sock:  # a body that starts and never ends: the same
        sock.sendall(heads[1] + b"10\r\n" + b"y" * 16 + b"\r\n")
        assert answer_of(sock)[0] == 408


def test_a_body_at_the_rate_is_served(server):
    with connect(server) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: 409600\r\n\r\n")
        for _ in range(10):  # 40 kB every 0.1 s: 400 kB/s
            sock.sendall(b"z" * 40960)
            time.sleep(0.1)
        status, _, body, _ = answer_of(sock)
    assert (status, body) == (200, b"409600")


def test_an_idle_keep_alive_connection_is_closed(server):
    with connect(server) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        time.sleep(0.2)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert sock.recv(65536) == b""  # closed by the server
        assert time.monotonic() - started < GRACE + 1.5


def test_a_client_that_reads_nothing_of_its_answer_is_dropped(server):
    with connect(server) as sock:
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(GRACE + 1.5)  # what the kernels' buffers hold still comes, then the end
        got = 0
        try:
            while chunk := sock.recv(2**20):
                got += len(chunk)
        except ConnectionResetError:
            pass
    assert got < 20 * 2**20  # cut off: the rest of the 20 MB never came


def test_connections_above_the_cap_get_503_with_retry_after(server):
    held = [connect(server) for _ in range(CAP)]
    try:
        time.sleep(0.1)
        with connect(server) as extra:
            extra.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            status, headers, body, _ = answer_of(extra)
        assert status == 503 and headers["retry-after"] == "2"
        assert json.loads(body)["message"] == f"server: more than {CAP} open connections; retry"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert request(server) == 200


def test_the_log_says_each_kind_once_per_interval():
    now = [0.0]
    throttle = Throttle(interval=10, clock=lambda: now[0])
    logger = logging.getLogger("test_throttle")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    handler.addFilter(throttle)
    logger.addHandler(handler)
    try:
        for second in range(25):
            now[0] = float(second)
            for _ in range(1000):
                logger.warning("refused: a connection over the cap of %d", 2048)
            logger.warning("refused: headers late")
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in records]
    assert said == ["refused: a connection over the cap of 2048", "refused: headers late",
                    "refused: a connection over the cap of 2048 (and 9999 more like it in "
                    "the last 10 s)",
                    "refused: headers late (and 9 more like it in the last 10 s)",
                    "refused: a connection over the cap of 2048 (and 9999 more like it in "
                    "the last 10 s)",
                    "refused: headers late (and 9 more like it in the last 10 s)"]


@pytest.mark.parametrize("sent", [
    b"NOT HTTP AT ALL\r\n\r\n",
    b"POST /invocations HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"POST /invocations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
], ids=["request line", "header", "chunk size"])
def test_a_request_h11_cannot_read_is_400_with_rul_s_json_line(server, sent):
    with connect(server) as sock:
        sock.sendall(sent)
        status, headers, body, _ = answer_of(sock)
    assert (status, headers["content-type"], headers["connection"]) == (
        400, "application/json", "close")
    assert json.loads(body)["message"].startswith("request: not valid HTTP/1.1")

"""Connections that cannot hold the server: deadlines for a request's headers and body, a client
that stops reading its answer, and a cap on open connections.

uvicorn waits without end for headers or a body that never finish and for a client that does
not read its answer, and accepts connections until the process runs out of file descriptors.
`protocol(limits)` is uvicorn's h11 protocol with a header deadline (`header_timeout` after the
connection opened or the request's first byte, else 408 and close), a minimum body rate
(`min_rate` on average after the same grace, else 408 and close), a write deadline (a client
reading nothing of its answer for the grace is dropped) and a cap (a connection above
`max_connections` is answered 503 with Retry-After at once, its sending side shut, and closed
LINGER_S later: a close with unread data would reset it before the client reads the answer).
A request h11 cannot read (a bad request line, header or chunk) is answered 400 with rul's JSON
line, not uvicorn's text/plain one.
Each refusal is a log line, one per kind per interval (rul.serving.refusal_log).
"""

import functools
import http
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from rul.serving.admission import RETRY_AFTER_S
from rul.serving.answers import error_json
from rul.serving.limits import Limits

logger = logging.getLogger("rul.serving")
LINGER_S = 1.0  # a refused connection is read (and dropped) this long, then closed


@functools.lru_cache(maxsize=16)  # a thousand connections cut at once: written, not rebuilt
def raw_response(status: int, line: str, code: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer of one JSON line that closes the connection, written where no
    request was read yet (uvicorn's h11 cannot answer before one)."""
    payload = error_json(line, code)
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
            "content-type: application/json", f"content-length: {len(payload)}",
            "connection: close", *([f"retry-after: {retry_after}"] if retry_after else [])]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with deadlines for a request's headers and body, a connection cap,
    and a client dropped that reads nothing of its answer (`limits`: set by `protocol`)."""

    limits: Limits

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = None  # the header or body deadline armed now
        self._stalled = None  # the write deadline, armed while the client reads nothing
        self._refused = False
        self._body_start = None
        self._body_bytes = 0

    def connection_made(self, transport):
        if len(self.connections) >= self.limits.max_connections:
            self._refused = True
            self.transport = transport
            logger.warning("refused: a connection over the cap of %d open connections "
                           "(503)", self.limits.max_connections)
            transport.write(raw_response(
                503, f"server: more than {self.limits.max_connections} open connections; "
                     "retry", "TEMPORARILY_UNAVAILABLE", RETRY_AFTER_S))
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
            return
        super().connection_made(transport)
        self._arm(self.limits.header_timeout, self._headers_late)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        self._watch(len(data))

    def connection_lost(self, exc):
        self._disarm()
        if self._stalled is not None:
            self._stalled.cancel()
        if not self._refused:
            super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.limits.header_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    # -- deadlines
    def _watch(self, received: int) -> None:
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._body_start is None:  # the headers are in: the body's clock starts
                self._body_start, self._body_bytes = self.loop.time(), 0
                self._arm(self.limits.header_timeout, self._body_check)
            self._body_bytes += received
        elif state is h11.IDLE:
            if self._deadline is None:  # a request's first bytes on a kept-alive one
                self._arm(self.limits.header_timeout, self._headers_late)
        else:  # the whole request is in
            self._body_start = None
            self._disarm()

    def _arm(self, seconds: float, then) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(max(seconds, 0.05), then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        logger.warning("refused: request headers not complete within %g s (408)",
                       self.limits.header_timeout)
        self._close_with(408, f"headers: not complete within {self.limits.header_timeout:g} s",
                         "REQUEST_TIMEOUT")

    def _body_check(self) -> None:
        self._deadline = None
        if self._body_start is None or self.transport.is_closing():
            return
        grace = self.limits.header_timeout
        owed = self.limits.min_rate * (self.loop.time() - self._body_start - grace)
        if self._body_bytes >= owed:  # in time: look again when what came is not enough
            due = self._body_start + grace + (self._body_bytes + 1) / self.limits.min_rate
            self._arm(due - self.loop.time(), self._body_check)
            return
        logger.warning("refused: a body slower than %g KB/s (408)", self.limits.min_rate_kb)
        self._close_with(408, f"body: arrived slower than {self.limits.min_rate_kb:g} KB/s",
                         "REQUEST_TIMEOUT")

    def _not_reading(self) -> None:
        self._stalled = None
        logger.warning("dropped: a client read nothing of its answer for %g s",
                       self.limits.header_timeout)
        self.transport.abort()  # close() would wait for the client to read the rest

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot read (its `msg` is its own words)."""
        logger.warning("refused: a request that is not valid HTTP/1.1 (400)")
        self._close_with(400, "request: not valid HTTP/1.1 (its request line, a header or the "
                              "body's chunked framing)", "BAD_REQUEST")

    def _close_with(self, status: int, line: str, code: str) -> None:
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(raw_response(status, line, code))
        self.transport.close()


def protocol(limits: Limits) -> type:
    """GuardedH11 with `limits`' deadlines and connection cap (uvicorn's Config(http=...))."""
    return type("GuardedH11", (GuardedH11,), {"limits": limits})

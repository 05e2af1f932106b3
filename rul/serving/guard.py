"""rul's guard: the ASGI app in front of MLflow's scoring app, answering /invocations itself.

For POST /invocations, in this order, each refusal one JSON line that quotes nothing of the
request: another method, 405 (Allow: POST); no Content-Type, 400, another type or charset, or a
Content-Encoding, 415 (rul.serving.bodies); a body over the limit, 413; a body whose expected
peak (declared or counted as it comes; then a JSON body by its containers too, a Parquet body
by its footer before it is read, then with the size it decodes to) does not fit what is left of
the memory budget, 503 with Retry-After, or 413 when it never could (rul.serving.admission); an
empty body, 400. Then the body is answered where it cannot stall the others (rul.serving.lanes)
with its deadline: past it, 504 and its work stops. A refused body is read on (and dropped) so
that the client hears the answer, within the connection's deadlines (rul.serving.connections),
but never more than the body limit again: a body with no end (or a Content-Length of 10**15) is
cut there, and a client that waits for `100 Continue` is answered before it sends a byte. The
answer closes the connection. MLflow's app answers /ping, /health and /version, FastAPI's
/docs, /redoc and /openapi.json only with `docs`; any other path is rul's 404 (never a
redirect, whose Location would come from the client's Host header).
"""

import asyncio
import time

from rul.serving.admission import RETRY_AFTER_S, Budget, expected_peak, json_peak, parquet_peak
from rul.serving.bodies import (
    DATA_KEYS,
    JSON,
    PARQUET,
    BodyError,
    decoded_size,
    footer_size,
    media_of,
    plain,
)
from rul.serving.lanes import IN_PROCESS_BYTES, Lanes, trim_memory
from rul.serving.limits import Limits
from rul.serving.scoring import Answer, logger, timed_out

MLFLOW_ROUTES = ("/ping", "/health", "/version")
DOCS_ROUTES = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


class Guard:
    def __init__(self, app, lanes: Lanes, limits: Limits, docs: bool = False):
        self.app, self.lanes, self.limits = app, lanes, limits
        self.max_body = limits.max_body
        self.budget = Budget(limits.memory)
        self.routes = MLFLOW_ROUTES + (DOCS_ROUTES if docs else ())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # lifespan
            return await self.app(scope, receive, send)
        if scope["path"] == "/invocations":
            return await self._invocations(scope, receive, send)
        if scope["path"] in self.routes:
            return await self.app(scope, receive, send)
        await _send(send, Answer.refusal(404, "path: not found; POST rows to /invocations",
                                         "ENDPOINT_NOT_FOUND"), close=False)

    async def _invocations(self, scope, receive, send):
        if scope["method"] != "POST":
            return await _send(send, Answer.refusal(405, "method: /invocations takes POST",
                                                    "METHOD_NOT_ALLOWED"),
                               extra=[(b"allow", b"POST")])
        headers = dict(scope.get("headers") or [])
        waiting = headers.get(b"expect", b"").strip().lower() == b"100-continue"
        try:
            media = media_of(headers.get(b"content-type"))
            plain(headers.get(b"content-encoding"))
        except BodyError as error:
            return await self._refuse(receive, send, Answer.refusal(error.status, error.line),
                                      waiting)
        declared = headers.get(b"content-length", b"")
        declared = int(declared) if declared.isdigit() else None
        reservation = self.budget.reserve(0)
        try:
            refusal = self._admit(reservation, media, declared)
            if refusal is not None:
                return await self._refuse(receive, send, refusal, waiting)
            body = await self._read(receive, reservation, media, declared is None)
            if isinstance(body, Answer):  # refused as it came (and read to its end)
                return await _send(send, body)
            if body is None:
                return  # the client left
            if not body:
                return await _send(send, Answer.refusal(
                    400, f"body: empty; send a JSON object with {DATA_KEYS}, or a CSV with its "
                         "header"))
            size, refusal = await self._admit_what_it_holds(reservation, media, body)
            if refusal is not None:
                return await _send(send, refusal)
            await _send(send, await self._answer(body, media, size))
        finally:
            body = None
            reservation.release()
            await asyncio.to_thread(trim_memory)

    async def _admit_what_it_holds(self, reservation, media: str, body: bytes
                                   ) -> tuple[int, Answer | None]:
        """(the bytes `body` stands for, a refusal or None): a Parquet body admitted by its
        footer before it is read, then by footer and decoded size; a JSON body also by what
        its containers cost, which may be more than its bytes say."""
        size = len(body)
        if media == PARQUET:
            try:
                footer = footer_size(body)
                refusal = self._admit(reservation, media, footer, peak=parquet_peak(0, footer))
                if refusal is not None:
                    return size, refusal
                decoded = await asyncio.to_thread(decoded_size, body)
                return decoded, self._admit(reservation, media, decoded,
                                            peak=parquet_peak(decoded, footer))
            except BodyError as error:
                return size, Answer.refusal(error.status, error.line)
        if media == JSON:
            peak = await asyncio.to_thread(json_peak, body)
            return size, self._admit(reservation, media, size, peak=peak)
        return size, None

    def _admit(self, reservation, media: str, size: int | None,
               peak: int | None = None) -> Answer | None:
        """None when a body of `size` bytes (None: not declared) fits the limit and the
        budget, its expected peak reserved; else a refusal. `peak`: the expected peak where
        the bytes do not say it (rul.serving.admission: a JSON body's containers, a Parquet
        body's footer and the size it decodes to, then `size`)."""
        if size is None:
            return None
        if size > self.max_body and peak is None:
            return self._too_large()
        peak = expected_peak(media, size) if peak is None else peak
        small = size <= IN_PROCESS_BYTES
        if peak > self.budget.limit(small):
            return self._too_large(peak)
        if not reservation.grow(peak, small):
            logger.warning("refused: a request that does not fit the memory budget (503)")
            return Answer.refusal(503, "server: busy with other requests' memory; retry "
                                       f"after {RETRY_AFTER_S} s", "TEMPORARILY_UNAVAILABLE",
                                  RETRY_AFTER_S)
        return None

    def _too_large(self, peak: int | None = None) -> Answer:
        if peak is None:
            line = (f"body: larger than this server's limit of {_mb(self.max_body)} MB; send "
                    "fewer engines per request (or raise --max-body-mb)")
        else:
            line = (f"body: would take about {_mb(peak)} MB to predict, more than this "
                    f"server's memory budget of {_mb(self.budget.total)} MB allows; send "
                    "fewer engines per request")
        return Answer.refusal(413, line, "REQUEST_LIMIT_EXCEEDED")

    async def _read(self, receive, reservation, media: str, counted: bool):
        """The whole body; None if the client left; the refusal (413, 503) when a body not
        declared outgrows the limit or the budget as it comes."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if counted and chunk:
                refusal = self._admit(reservation, media, size)
                if refusal is not None:
                    parts.clear()
                    if message.get("more_body"):
                        await _drain(receive, self.max_body)
                    return refusal
            parts.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(parts)
        parts.clear()
        return body

    async def _answer(self, body: bytes, media: str, size: int) -> Answer:
        due = time.monotonic() + self.limits.timeout
        try:
            return await asyncio.wait_for(self.lanes.run(body, media, due, size),
                                          self.limits.timeout)
        except TimeoutError:
            return timed_out(self.limits.timeout)

    async def _refuse(self, receive, send, answer: Answer, waiting: bool = False):
        """Read the rest of the body (dropped, up to the body limit) so that the client hears
        `answer`; none when the client waits for `100 Continue` (`waiting`): it has sent
        nothing, and reading would ask it to send."""
        if not waiting:
            await _drain(receive, self.max_body)
        await _send(send, answer)


def _mb(size: int) -> str:
    return f"{size / 2**20:,.1f}".removesuffix(".0")


async def _drain(receive, most: int) -> None:
    """Read what is left of a body, dropped, until its end or `most` bytes (then the answer
    and the connection's close cut it)."""
    read = 0
    while read <= most:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            return
        read += len(message.get("body", b""))


async def _send(send, answer: Answer, close: bool = True, extra=()) -> None:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(answer.payload)).encode()),
               (b"x-content-type-options", b"nosniff"), *extra]
    if answer.retry_after is not None:
        headers.append((b"retry-after", str(answer.retry_after).encode()))
    if close and answer.status >= 400:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.payload})


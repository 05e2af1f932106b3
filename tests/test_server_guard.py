"""rul's guard in front of MLflow's scoring app (rul.serving.guard.Guard), driven through ASGI
directly with a stand-in for the lanes that predict: the method, the Content-Type, the body
limit (declared or streamed), the memory budget (declared, streamed, shared by requests in
flight), the deadline that reaches the prediction's thread and stops it, the routes served.
The served model end to end is in test_serving.py, the hostile clients in
test_hostile_clients.py."""

import asyncio
import json
import time

import pytest

from rul.serving import admission, deadline
from rul.serving.guard import Guard
from rul.serving.limits import Limits
from rul.serving.scoring import Answer, timed_out

JSON = ("content-type", "application/json")


class Lanes:
    """Answers 200 with the body's length, after `seconds` in a thread that checks its
    deadline as the prediction does; records what it was given."""

    def __init__(self, seconds: float = 0.0):
        self.seconds, self.seen = seconds, []
        self.stopped_after, self.past_deadline = [], []  # seconds: from its start, its deadline

    async def run(self, body, media, deadline_at, size=None):
        self.seen.append((body, media, size))
        return await asyncio.to_thread(self._work, len(body), deadline_at)

    def _work(self, size, deadline_at):
        token = deadline.DEADLINE.set(deadline_at)
        started = time.monotonic()
        try:
            while time.monotonic() - started < self.seconds:
                time.sleep(0.01)
                deadline.check()
        except deadline.RequestTimedOut:  # answered as the served model's lane answers it
            now = time.monotonic()
            self.stopped_after.append(now - started)
            self.past_deadline.append(now - deadline_at)
            return timed_out()
        finally:
            deadline.DEADLINE.reset(token)
        return Answer(200, json.dumps({"size": size}).encode())


async def mlflow_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"mlflow"})


def guard(lanes=None, **limits) -> Guard:
    return Guard(mlflow_app, lanes or Lanes(), Limits(**{"max_body_mb": 1000 / 2**20,
                                                         **limits}))


def call(app, chunks: list[bytes], headers=(JSON,), method="POST",
         path="/invocations") -> tuple[int, dict, bytes]:
    """One request with the body in `chunks`: (status, headers, body)."""
    return asyncio.run(_call(app, chunks, headers, method, path))


async def _call(app, chunks, headers, method, path):
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)] or [{"type": "http.request", "body": b""}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # uvicorn waits for more: a guard reading past the end hangs

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "method": method,
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    await asyncio.wait_for(app(scope, receive, send), 10)
    assert not messages or method != "POST", "the body was not read to its end"
    return (sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def message(body: bytes) -> str:
    return json.loads(body)["message"]


def test_a_body_over_the_limit_is_413_before_the_lanes_see_it():
    lanes = Lanes()
    app = guard(lanes)
    status, _, body = call(app, [b"x" * 1001], headers=[JSON, ("content-length", "1001")])
    assert status == 413 and "limit of" in message(body) and not lanes.seen
    status, _, _ = call(app, [b"x" * 600, b"x" * 600])  # streamed, no length declared
    assert status == 413 and not lanes.seen
    status, _, body = call(app, [b"x" * 500, b"y" * 500])
    assert status == 200 and lanes.seen[0][:2] == (b"x" * 500 + b"y" * 500, "json")


def test_an_empty_body_is_one_line():
    status, _, body = call(guard(), [])
    assert status == 400 and message(body).startswith("body: empty")


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"])
def test_another_method_on_invocations_is_405(method):
    status, headers, body = call(guard(), [], method=method)
    assert status == 405 and headers["allow"] == "POST"
    assert message(body) == "method: /invocations takes POST"


def test_no_content_type_is_400_and_another_is_415_without_repeating_it():
    status, _, body = call(guard(), [b"{}"], headers=[])
    assert status == 400 and message(body) == (
        "headers: Content-Type is missing; send application/json, text/csv or "
        "application/vnd.apache.parquet")
    hostile = "text/<script>alert(1)</script>" + "x" * 700
    for content_type in (hostile, "application/json; charset=latin-1",
                         f"application/json; {'y' * 700}=1"):
        status, _, body = call(guard(), [b"{}"], headers=[("content-type", content_type)])
        assert status == 415, content_type
        assert b"script" not in body and b"yyy" not in body and b"latin" not in body
        assert len(body) < 300 and "application/json, text/csv" in message(body)
    status, _, _ = call(guard(), [b"{}"], headers=[("content-type", "Text/CSV; charset=UTF-8")])
    assert status == 200


def test_the_memory_budget_admits_what_fits_and_refuses_the_rest_with_retry_after():
    """A budget of 1 MB: a declared body whose expected peak is more than what is left is a
    503 with Retry-After (its body read and dropped); one more than the whole budget a 413;
    a body without a length is counted as it comes."""
    ratio = admission.PEAK_PER_BYTE["json"]
    fits, too_big = int(0.5 * 2**20 / ratio), int(1.5 * 2**20 / ratio)
    app = guard(memory_mb=1, max_body_mb=10)
    status, _, _ = call(app, [b"x" * fits], headers=[JSON, ("content-length", str(fits))])
    assert status == 200
    status, headers, body = call(app, [b"x" * too_big],
                                 headers=[JSON, ("content-length", str(too_big))])
    assert status == 413 and "memory budget of 1 MB" in message(body)
    status, _, _ = call(app, [b"x" * 1000] * (too_big // 1000))
    assert status == 413
    assert app.budget.used == 0  # every reservation went back


def test_requests_in_flight_share_the_budget():
    ratio = admission.PEAK_PER_BYTE["json"]
    size = int(0.6 * 2**20 / ratio)  # 60 % of the budget each: one at a time
    lanes = Lanes(seconds=0.5)
    app = guard(lanes, memory_mb=1, max_body_mb=10)

    async def both():
        first = asyncio.create_task(_call(app, [b"x" * size], [JSON], "POST", "/invocations"))
        await asyncio.sleep(0.1)
        second = await _call(app, [b"x" * size], [JSON, ("content-length", str(size))], "POST",
                             "/invocations")
        return await first, second

    first, second = asyncio.run(both())
    assert first[0] == 200
    assert second[0] == 503 and second[1]["retry-after"] == str(admission.RETRY_AFTER_S)
    assert message(second[2]).startswith("server: busy with other requests' memory; retry")
    assert app.budget.used == 0
    assert call(app, [b"x" * size], headers=[JSON, ("content-length", str(size))])[0] == 200


def test_the_deadline_reaches_the_worker_thread_and_stops_the_work():
    lanes = Lanes(seconds=2.0)
    status, _, body = call(guard(lanes, timeout=0.2), [b"{}"])
    # the guard's timer or the thread's own check, whichever comes first: a 504 either way
    assert status == 504 and message(body).startswith("request: ran past this server's timeout")
    time.sleep(0.3)
    # stopped once its deadline had passed (the deadline is set as the request arrives: the
    # thread starts a little later, so under load its own clock reads under 0.2 s) and long
    # before its 2 s of work
    assert lanes.past_deadline and lanes.past_deadline[0] >= 0
    assert lanes.stopped_after[0] < 1.0
    assert deadline.DEADLINE.get() is None  # nothing left set outside the request


def test_mlflow_answers_its_routes_and_the_rest_is_a_404_of_rul_s():
    for path in ("/ping", "/health", "/version"):
        assert call(guard(), [], method="GET", path=path)[2] == b"mlflow"
    for path in ("/docs", "/redoc", "/openapi.json", "/invocations/", "/anything"):
        status, headers, body = call(guard(), [], method="GET", path=path)
        assert status == 404 and "location" not in headers, path
        assert message(body) == "path: not found; POST rows to /invocations"
    docs = Guard(mlflow_app, Lanes(), Limits(), docs=True)
    assert call(docs, [], method="GET", path="/openapi.json")[2] == b"mlflow"


def test_a_share_of_the_budget_is_kept_for_small_requests():
    """Large bodies may take the budget but its SMALL_SHARE: while they hold all they may, a
    one-engine request is still admitted."""
    large = int(1.2 * 2**20)  # above IN_PROCESS_BYTES: the worker's
    lanes = Lanes(seconds=0.5)
    app = guard(lanes, memory_mb=32, max_body_mb=10)
    assert admission.expected_peak("json", large) <= 32 * 2**20 * (1 - admission.SMALL_SHARE)

    async def together():
        first = asyncio.create_task(_call(app, [b"x" * large], [JSON], "POST", "/invocations"))
        await asyncio.sleep(0.1)
        second = await _call(app, [b"x" * large], [JSON], "POST", "/invocations")
        small = await _call(app, [b"x" * 30_000], [JSON], "POST", "/invocations")
        return await first, second, small

    first, second, small = asyncio.run(together())
    assert (first[0], second[0], small[0]) == (200, 503, 200)


async def _endless(app, headers) -> tuple[int, str, int]:
    """A POST whose body never ends: (status, its line, the reads the guard made)."""
    reads, sent = 0, []

    async def receive():
        nonlocal reads
        reads += 1
        await asyncio.sleep(0)  # as a socket's read: the guard's timeout can fire
        return {"type": "http.request", "body": b"x" * 100, "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/invocations", "method": "POST",
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    await asyncio.wait_for(app(scope, receive, send), 5)
    return sent[0]["status"], message(sent[1]["body"]), reads


def test_a_body_with_no_end_is_read_on_up_to_the_limit_and_cut_with_413():
    """A limit of 1,000 bytes, 100 bytes a read: a Content-Length of 10**15 is refused at once
    and read on for the limit at most, a chunked body with no end the same once past it (it
    was read to its end: forever); a client waiting for 100 Continue is answered before it
    sends a byte (a read would ask it to send)."""
    declared = [JSON, ("content-length", str(10**15))]
    for headers, most in ((declared, 11), ([JSON], 22),
                          ([*declared, ("expect", "100-continue")], 0),
                          ([("content-type", "text/html"), ("expect", "100-Continue")], 0)):
        status, line, reads = asyncio.run(_endless(guard(), headers))
        assert status in (413, 415) and reads <= most, (headers, reads)
        assert line.startswith(("body: larger than this server's limit of",
                                "headers: Content-Type must be")), line


def test_a_compressed_body_is_refused_saying_so():
    status, _, body = call(guard(), [b"{}"], headers=[JSON, ("content-encoding", "gzip")])
    assert (status, message(body)) == (
        415, "headers: Content-Encoding is not accepted; send the body uncompressed")
    assert call(guard(), [b"{}"], headers=[JSON, ("content-encoding", "identity")])[0] == 200


def test_a_parquet_body_is_admitted_by_its_footer_before_the_footer_is_read(monkeypatch):
    """Reading a footer of 100,000 columns took 300 MB: a body whose footer alone would not
    fit the budget is a 413 before it is read; one that fits is read and admitted by its
    footer and decoded size together."""
    import io

    import pandas as pd

    from rul.serving import guard as guard_module
    from rul.serving.bodies import footer_size

    parquet = ("content-type", "application/vnd.apache.parquet")
    sink = io.BytesIO()
    pd.DataFrame({f"c{i}": [0.0] for i in range(3000)}).to_parquet(sink)
    body = sink.getvalue()
    footer = footer_size(body)
    budget = 10 * len(body)  # the bytes sent fit it; the footer read would not
    assert admission.expected_peak("parquet", len(body)) < budget
    assert admission.parquet_peak(0, footer) > budget
    read = []
    monkeypatch.setattr(guard_module, "decoded_size", lambda b: read.append(b) or 8)
    lanes = Lanes()
    status, _, answer = call(guard(lanes, memory_mb=budget / 2**20, max_body_mb=10), [body],
                             headers=[parquet])
    assert status == 413 and "would take about" in message(answer)
    assert not read and not lanes.seen
    status, _, _ = call(guard(lanes, memory_mb=64, max_body_mb=10), [body], headers=[parquet])
    assert status == 200 and read and lanes.seen


def test_a_json_body_of_containers_is_admitted_by_what_they_cost():
    """100,000 empty records: 19 x its 300 KB fits a budget of 8 MB, what the records take
    once parsed (100 bytes each) does not: 413 before it is parsed. Rows of numbers are
    admitted by their bytes as before."""
    records = b'{"dataframe_records": [' + b",".join([b"{}"] * 100_000) + b"]}"
    assert admission.expected_peak("json", len(records)) < 8 * 2**20
    assert admission.json_peak(records) > 8 * 2**20
    lanes = Lanes()
    status, _, body = call(guard(lanes, memory_mb=8, max_body_mb=10), [records])
    assert status == 413 and "would take about 9.5 MB" in message(body) and not lanes.seen
    rows = b'{"dataframe_split": {"data": [' + b",".join([b"[1, 2, 3]"] * 30_000) + b"]}}"
    assert admission.json_peak(rows) == admission.expected_peak("json", len(rows))
    assert call(guard(lanes, memory_mb=8, max_body_mb=10), [rows])[0] == 200

"""rul's guard in front of MLflow's scoring app (rul.serving.server.RequestGuard), driven
through ASGI directly: the body limit (declared or streamed), the deadline that reaches the
prediction's worker thread and stops it, MLflow's multi-line 400s made one line.
The served model end to end is in test_serving.py."""

import asyncio
import json
import time

from rul.serving import deadline
from rul.serving.server import RequestGuard, rewrite_400


def call(guard, chunks: list[bytes], headers=()) -> tuple[int, dict]:
    """POST /invocations with the body in `chunks`; (status, JSON answer)."""
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)] or [{"type": "http.request", "body": b""}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/invocations", "method": "POST",
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def echo_app(status=200, body=b'{"predictions": []}'):
    seen = {}

    async def app(scope, receive, send):
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    return app, seen


def test_a_body_over_the_limit_is_413_before_the_app_sees_it():
    app, seen = echo_app()
    guard = RequestGuard(app, max_body=1000, timeout=60)
    status, answer = call(guard, [b"x" * 1001], headers=[("content-length", "1001")])
    assert status == 413 and "limit of" in answer["message"] and "body" not in seen
    status, _ = call(guard, [b"x" * 600, b"x" * 600])  # streamed, no length declared
    assert status == 413 and "body" not in seen
    status, _ = call(guard, [b"x" * 500, b"y" * 500])
    assert status == 200 and seen["body"] == b"x" * 500 + b"y" * 500


def test_an_empty_body_is_one_line():
    guard = RequestGuard(echo_app()[0], max_body=1000, timeout=60)
    status, answer = call(guard, [])
    assert status == 400 and answer["message"].startswith("body: empty")


def test_the_deadline_reaches_the_worker_thread_and_stops_the_work():
    stopped_after = []

    def predict():  # a prediction checking its deadline between batches
        for _ in range(200):
            time.sleep(0.01)
            try:
                deadline.check()
            except deadline.RequestTimedOut:
                stopped_after.append(time.monotonic() - sent)
                raise

    async def app(scope, receive, send):
        await receive()
        try:
            await asyncio.to_thread(predict)  # as MLflow's scoring server runs predict
            status = 200
        except deadline.RequestTimedOut:
            status = 504
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent = time.monotonic()  # the deadline counts from the request, not from predict's start
    status, _ = call(RequestGuard(app, max_body=1000, timeout=0.2), [b"{}"])
    assert status == 504 and 0.2 <= stopped_after[0] < 1.0
    assert deadline.DEADLINE.get() is None  # nothing left set outside the request


def test_mlflow_s_400s_become_one_line_that_quotes_no_data():
    rows = "[[1, 1, -0.0007, 518.67, 641.82]]"
    bodies = {
        "Invalid input. The input must be a JSON dictionary with exactly one of the input "
        "fields {'dataframe_split', ...}. Received dictionary with input fields: []. "
        "IMPORTANT: The MLflow Model scoring protocol has changed ...":
            "body: a JSON object needs exactly one of dataframe_split or dataframe_records",
        f"Ensure that input is a valid JSON formatted string. Error: 'x'\nInput: \n{rows}\n":
            "body: not valid JSON",
        f"Failed to predict data '{rows}'. \nError: Failed to enforce schema of params "
        "`{'horizon': 'abc'}` with signature `['horizon': double (default: 20.0)]`. "
        "Error: Failed to convert value `abc` from type `str` to `DataType.double` for param "
        "'horizon'": "params: horizon must be a number of cycles",
        f"Failed to predict data '{rows}'. \nError: something\nelse": "something",
    }
    for message, line in bodies.items():
        answer = json.loads(rewrite_400(json.dumps({"error_code": "BAD_REQUEST",
                                                    "message": message}).encode()))
        assert answer["message"].startswith(line), (message, answer)
        assert "518.67" not in answer["message"] and "\n" not in answer["message"]
    own = json.dumps({"error_code": "INVALID_PARAMETER_VALUE",
                      "message": "input: row 2, column s_3: 'hot' is not a number"}).encode()
    assert rewrite_400(own) == own

"""`make serve`: a registered model behind MLflow's scoring server, with rul's guard in front.

    python -m rul.serving.server MODEL [--host H] [--port P] [--max-body-mb N] [--timeout S]

MODEL is a model URI (`models:/rul-fd001@champion`, `runs:/<id>/model`) or a model folder.
The routes, request formats and answers are MLflow's (`/invocations`, `/ping`, `/health`,
`/version`; `init` of mlflow.pyfunc.scoring_server builds them); the guard adds what a
service owes its callers:
- a body over the limit (`--max-body-mb`, default MAX_BODY_MB; env RUL_SERVE_MAX_BODY_MB) is
  answered 413 before anything is parsed;
- every 400 is one line under 300 characters that never echoes the request: MLflow's own
  refusals (a body that is not JSON, `{}`, an empty body, a parameter of the wrong type) are
  rewritten into rul's lines, the model's own lines (RequestError) pass as they are;
- a request past its timeout (`--timeout`, MLflow's MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT,
  default 60 s) gets MLflow's 504 and its prediction stops at its next check
  (rul.serving.deadline) instead of running on; after each request the freed memory goes
  back to the system (glibc's malloc_trim).

It needs only what the model's own requirements install (mlflow-skinny brings uvicorn and
FastAPI): in a lean environment, run it from the model folder's code/ (docs: Predict and
serve).
"""

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import re
import sys
import time

from rul.serving import deadline
from rul.serving.request_errors import MAX_LINE, one_line

MAX_BODY_MB = 64  # ~1,600 engines of 200 cycles as JSON; FD001's 100 test engines are 3 MB
TIMEOUT_ENV = "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"
BODY_ENV = "RUL_SERVE_MAX_BODY_MB"
DATA_KEYS = "dataframe_split or dataframe_records"


def _params_line(message: str) -> str:
    """Which parameter had the wrong type, from MLflow's message, without the data."""
    kinds = {"horizon": "a number of cycles", "strict": "true or false",
             "short_history": "a string, pad or reject"}
    for name, kind in kinds.items():
        if f"'{name}'" in message:
            return f"params: {name} must be {kind}"
    return "params: a parameter has the wrong type (short_history, strict, horizon)"


# MLflow's refusals, by a phrase of theirs, and rul's line for each (the rest of MLflow's
# message may quote the request, so none of it is kept).
_REWRITES = (
    (re.compile(r"Ensure that input is a valid JSON"),
     f"body: not valid JSON; send a JSON object with {DATA_KEYS} (and params), or a CSV"),
    (re.compile(r"The input must be a JSON dictionary"),
     f"body: a JSON object needs exactly one of {DATA_KEYS} (and may have params)"),
    (re.compile(r"Invalid parameters found|Failed to enforce schema of params"), _params_line),
    (re.compile(r"Failed to parse input as a Pandas DataFrame"),
     "body: not a CSV pandas can read; send DataFrame.to_csv()'s output, with its header"),
)


def rewrite_400(body: bytes) -> bytes:
    """One line of rul's for MLflow's multi-line or data-quoting 400 bodies; rul's own lines
    (one line, already short) unchanged."""
    try:
        answer = json.loads(body)
        message = str(answer.get("message", ""))
    except (ValueError, AttributeError):
        message = body.decode(errors="replace")
        answer = {"error_code": "BAD_REQUEST"}
    line = None
    for pattern, said in _REWRITES:
        if pattern.search(message):
            line = said(message) if callable(said) else said
            break
    if line is None:
        if "\n" not in message and len(message) <= MAX_LINE and "stack_trace" not in answer:
            return body  # rul's own RequestError line
        stripped = re.sub(r"^Failed to predict data '.*?'\.\s*Error:\s*", "", message, flags=re.S)
        line = stripped.strip().splitlines()[0] if stripped.strip() else "bad request"
    return json.dumps({"error_code": answer.get("error_code", "BAD_REQUEST"),
                       "message": one_line(line)}).encode()


def _trim_memory() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RequestGuard:
    """ASGI middleware around MLflow's scoring app: body limit, one-line 400s, deadline."""

    def __init__(self, app, max_body: int, timeout: float):
        self.app, self.max_body, self.timeout = app, max_body, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/invocations":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > self.max_body
        parts, size = [], 0
        while True:  # the whole body (MLflow reads it whole too), counted as it comes; past
            message = await receive()  # the limit the rest is read and dropped, so that
            if message["type"] == "http.disconnect":  # the client hears the 413
                return
            size += len(message.get("body", b""))
            if not too_large and size > self.max_body:
                too_large = True
                parts.clear()  # not held while the rest is drained
            if not too_large:
                parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if too_large:
            return await self._too_large(send)
        body = b"".join(parts)
        del parts
        if not body:
            return await _answer(send, 400, f"body: empty; send a JSON object with {DATA_KEYS},"
                                            " or a CSV with its header")
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        start, chunks = {}, []

        async def keep(message):
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    await self._send(send, start, b"".join(chunks))

        token = deadline.DEADLINE.set(time.monotonic() + self.timeout)
        try:
            await self.app(scope, replay, keep)
        finally:
            deadline.DEADLINE.reset(token)
            body = None  # the request's bytes go before the trim
            await asyncio.get_running_loop().run_in_executor(None, _trim_memory)

    async def _send(self, send, start, payload: bytes):
        if start.get("status") == 400:
            payload = rewrite_400(payload)
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(payload)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _too_large(self, send):
        mb = self.max_body / 2**20
        await _answer(send, 413, f"body: larger than this server's limit of {mb:g} MB; send "
                                 f"fewer engines per request (or raise --max-body-mb)",
                      "REQUEST_LIMIT_EXCEEDED")


async def _answer(send, status: int, line: str, code: str = "BAD_REQUEST"):
    payload = json.dumps({"error_code": code, "message": one_line(line)}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def build(model_uri: str, max_body_mb: float = MAX_BODY_MB, timeout: float | None = None):
    """The guarded ASGI app serving `model_uri`; `timeout`: seconds (None: MLflow's env var,
    else 60)."""
    if timeout is not None:
        os.environ[TIMEOUT_ENV] = str(int(timeout))  # read by MLflow's init
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(model_uri)
    app = scoring_server.init(model)
    seconds = float(os.environ.get(TIMEOUT_ENV) or 60)
    return RequestGuard(app, int(max_body_mb * 2**20), seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rul.serving.server",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="models:/rul-fd001@champion, runs:/<id>/model or a folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--max-body-mb", type=float,
                        default=float(os.environ.get(BODY_ENV) or MAX_BODY_MB),
                        help=f"larger bodies get 413 (default {MAX_BODY_MB}; env {BODY_ENV})")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"seconds per request, then 504 and its work stops (default: "
                             f"{TIMEOUT_ENV} or 60)")
    args = parser.parse_args(argv)
    if args.max_body_mb <= 0:
        parser.error(f"--max-body-mb must be positive, got {args.max_body_mb:g}")
    import uvicorn

    app = build(args.model, args.max_body_mb, args.timeout)
    print(f"serving {args.model} on http://{args.host}:{args.port}/invocations "
          f"(bodies up to {args.max_body_mb:g} MB, {os.environ.get(TIMEOUT_ENV) or 60} s "
          f"per request)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

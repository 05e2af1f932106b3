"""A request's answer, from its body to the bytes sent: read the rows, predict, write strict JSON.

`answer` is the one path, whether it runs in the server's own process or in its worker
(rul.serving.lanes): the model is rul's lean model read as data (rul.serving.served.Served:
never the model folder's code), rows and parameters in, a frame out.
Every refusal is one line: a body that is none of the formats (rul.serving.bodies), rows or
parameters the model refuses (400), a request past its deadline (504, its work stopped), a
request the memory could not hold after all (503 with Retry-After); anything else is a 500
whose line says nothing of the request, its cause logged once per kind and interval
(rul.serving.refusal_log).
"""

import logging
from dataclasses import dataclass

from mlflow.exceptions import MlflowException

from rul.data.errors import DataError
from rul.data.validation import validate_rows
from rul.serving import deadline
from rul.serving.admission import PEAK_PER_ENGINE, RETRY_AFTER_S, engines_allowed
from rul.serving.answers import error_json, predictions_json, refusal_line
from rul.serving.bodies import PARQUET, BodyError, read_body

logger = logging.getLogger("rul.serving")
TYPED_FIRST = 50_000  # rows (10 MB as a frame) from which the parsed frame goes before predicting


@dataclass(frozen=True)
class Answer:
    status: int
    payload: bytes
    retry_after: int | None = None  # seconds, for a 503

    @classmethod
    def refusal(cls, status: int, line: str, code: str = "BAD_REQUEST",
                retry_after: int | None = None) -> "Answer":
        return cls(status, error_json(line, code), retry_after)


def answer(model, body: bytes, media: str) -> Answer:
    """The answer to `body` (of `media`: rul.serving.bodies' JSON, CSV or PARQUET) from the
    served pyfunc `model`."""
    try:
        size = len(body)
        rows, params = read_body(body, media, getattr(model, "columns", None),
                                 getattr(model, "optional", ()))
        del body
        check_engines(rows, getattr(model, "unit", None), media, size)
        rows = typed(rows)
        predictions = model.predict(rows, params=params)
        del rows
        return Answer(200, predictions_json(predictions))
    except BodyError as error:
        return Answer.refusal(error.status, error.line,
                              "REQUEST_LIMIT_EXCEEDED" if error.status == 413 else "BAD_REQUEST")
    except deadline.RequestTimedOut:
        return timed_out()
    except MlflowException as error:
        return Answer.refusal(400, refusal_line(error), "INVALID_PARAMETER_VALUE")
    except MemoryError:
        logger.warning("refused: a request ran out of memory (503)")
        return Answer.refusal(503, "server: out of memory for this request; retry, or send "
                                   "fewer engines per request", "TEMPORARILY_UNAVAILABLE",
                              RETRY_AFTER_S)
    except Exception as error:  # a fault of the server's, not the request's
        logger.error("a request failed: %s", type(error).__name__, exc_info=True)
        return Answer.refusal(500, "server: the prediction failed (an internal error, "
                                   "logged); the server keeps serving", "INTERNAL_ERROR")


def check_engines(rows, unit: str | None, media: str, size: int) -> None:
    """BodyError (413) when `rows` hold more engines (runs of one `unit` value) than a body of
    `size` bytes of `media` is admitted for (rul.serving.admission.engines_allowed; a Parquet
    body by the bytes its rows take as read). Rows without the unit column pass: the model
    names what is missing."""
    if unit is None or unit not in rows.columns:
        return
    ids = rows[unit]
    engines = int((ids.ne(ids.shift()) & ids.notna()).sum())
    read = len(rows) * len(rows.columns) * 8 if media == PARQUET else size
    allowed = engines_allowed(media, read)
    if engines > allowed:
        raise BodyError(f"body: {engines:,} engines in {size / 2**20:.1f} MB: each takes about "
                        f"{PEAK_PER_ENGINE / 1000:g} KB to predict however few its rows, more "
                        f"than a body this size is admitted for ({allowed:,} engines); send "
                        "fewer engines per request", 413)


def typed(rows):
    """Many rows validated (rul.data.validation), so that the frame as parsed can go before
    the model runs: the model validates them again, sharing their columns (no copy). Fewer
    than TYPED_FIRST rows, and rows that do not validate, are returned as they are: the model
    refuses them in its own order (a bad parameter before a bad row), as it would in Python;
    a small frame is not worth the second validation's few milliseconds."""
    if len(rows) < TYPED_FIRST:
        return rows
    try:
        return validate_rows(rows)
    except DataError:
        return rows


def timed_out(timeout: float | None = None) -> Answer:
    after = f" of {timeout:g} s" if timeout is not None else ""
    return Answer.refusal(504, f"request: ran past this server's timeout{after}; its work "
                               "stopped; send fewer engines per request", "DEADLINE_EXCEEDED")

"""What the server sends: strict JSON, always.

`predictions_json` writes a prediction as MLflow's scoring server does (`{"predictions":
[one record per engine]}`, floats as Python writes them: the same text for every number), but
a number that does not exist is `null`, never NaN or Infinity, which JSON does not have
(JavaScript's JSON.parse and strict parsers reject the whole answer). `error_json` writes a
refusal: MLflow's `error_code` and one line in `message`. Both escape <, > and & (as \\u003c
...), so that no answer reads as markup wherever it is shown.

`refusal_line` turns the message of an exception MLflow raised while predicting (its check of
the parameters' types: the message quotes the request) into one line of rul's that quotes
nothing of it; rul's own lines (RequestError) pass as they are.
"""

import json
import math
import re

from rul.serving.request_errors import MAX_LINE, RequestError, one_line

RECORDS_AT_ONCE = 4096  # records of an answer made into JSON at once
_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
_MARKUP = re.compile("[<>&]")


def _dumps(value) -> bytes:
    text = json.dumps(value, allow_nan=False, default=_native)
    return _MARKUP.sub(lambda m: _ESCAPES[m.group()], text).encode()


def _native(value):
    item = getattr(value, "item", None)  # a numpy scalar
    if item is None:
        raise TypeError(f"{type(value).__name__} is not JSON")
    return item()


def _finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def predictions_json(frame) -> bytes:
    """`{"predictions": [...]}`, one record per row of `frame` (a pandas DataFrame), with
    null for NaN and infinities; written RECORDS_AT_ONCE records at a time (a record is a
    dict of Python objects, about 1 KB: 100,000 engines took 127 MB at once), the same
    bytes as json.dumps of the whole."""
    parts = []
    for start in range(0, len(frame), RECORDS_AT_ONCE):
        records = [{name: _finite(value) for name, value in record.items()}
                   for record in frame.iloc[start:start + RECORDS_AT_ONCE]
                   .to_dict(orient="records")]
        parts.append(_dumps(records)[1:-1])  # the records, without the list's brackets
        del records
    return b'{"predictions": [' + b", ".join(parts) + b"]}"


def error_json(line: str, code: str = "BAD_REQUEST") -> bytes:
    return _dumps({"error_code": code, "message": one_line(line)})


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
    (re.compile(r"Invalid parameters found|Failed to enforce schema of params"), _params_line),
)


def refusal_line(error: Exception) -> str:
    """One line of rul's for an MlflowException raised while predicting: a RequestError's own
    line, MLflow's by the phrase it starts with, never the rest of MLflow's message."""
    if isinstance(error, RequestError):
        return error.message
    message = str(getattr(error, "message", error))
    if message.startswith("input: ") and "\n" not in message and len(message) <= MAX_LINE:
        return message  # the line of a model logged before RequestError (rul's pyfunc_model)
    for pattern, said in _REWRITES:
        if pattern.search(message):
            return said(message)
    return "input: refused by MLflow's checks of the request (its rows or parameters)"

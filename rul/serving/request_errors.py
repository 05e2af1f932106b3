"""A bad request, said in one line, over `mlflow models serve` as in process.

MLflow's scoring server rewrites the message of any MlflowException raised while predicting
to start with a dump of the whole request ("Failed to predict data '...'"). RequestError keeps
its own line: its `message` is set once, by its constructor. The line is cut to MAX_LINE
characters, so that the 400 body (MLflow's JSON around it) stays under 300.

MLflow also drops request parameters its signature does not declare, with a warning and no
error. `watch_unknown_params` listens for that warning and notes the dropped names on the
call's prediction context (one per PyFuncModel.predict call), where `unknown_params` reads
them, so that the model can refuse them. It hears the warning whatever MLflow's log level
(MLFLOW_LOGGING_LEVEL=ERROR included: that one logger keeps WARNING, and the listener drops
the other records MLflow's level would drop), and keeps it from the user: the refusal says
it.
"""

import ast
import contextlib
import logging
import re

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc.context import get_prediction_context

MAX_LINE = 180
_DROPPED = re.compile(r"Unrecognized params (\[.*?\]) are ignored")
_NOTE = "rul_unknown_params"  # the attribute on mlflow.pyfunc.context.Context


def one_line(message: str, limit: int = MAX_LINE) -> str:
    line = " ".join(str(message).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class RequestError(MlflowException):
    """HTTP 400 with `message` as given (one line), whatever the server prepends."""

    def __init__(self, message: str):
        super().__init__(one_line(message), error_code=INVALID_PARAMETER_VALUE)

    @property
    def message(self) -> str:
        return self._line

    @message.setter
    def message(self, value: str) -> None:
        if not hasattr(self, "_line"):  # the constructor's; the server's rewrite is dropped
            self._line = value


class _DroppedParams(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        found = _DROPPED.search(record.getMessage())
        if found is None:  # another record: as MLflow's level (set by the user) says
            return record.levelno >= logging.getLogger("mlflow").getEffectiveLevel()
        context = get_prediction_context()
        if context is not None:
            with contextlib.suppress(ValueError, SyntaxError):
                setattr(context, _NOTE, [str(n) for n in ast.literal_eval(found.group(1))])
        return False  # the refusal says it


_FILTER = _DroppedParams()


def watch_unknown_params() -> None:
    """Listen (once per process) for the parameters MLflow drops, at any log level: the
    logger that warns of them keeps WARNING whatever MLflow's level is set to, then or later."""
    logger = logging.getLogger("mlflow.models.utils")
    if _FILTER not in logger.filters:
        logger.setLevel(min(logging.WARNING, logger.getEffectiveLevel()))
        logger.addFilter(_FILTER)


def unknown_params() -> list[str]:
    """The parameter names MLflow dropped in this predict call."""
    return list(getattr(get_prediction_context(), _NOTE, []) or [])

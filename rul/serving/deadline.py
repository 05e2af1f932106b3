"""The time a served request may still take, and the check that stops its work after that.

rul's server answers 504 when a request outlasts its timeout (rul.serving.guard), but the
prediction would go on in its thread or worker process, holding the memory. So each request's
work runs with `DEADLINE` set, in the thread or the worker process that predicts
(rul.serving.lanes: the monotonic clock is the machine's, the same in both), and the
prediction calls `check()` between its steps and its batches of windows, so that a request
past its deadline stops there. Outside a served request (the CLI, Python) there is
no deadline and `check()` does nothing. Standard library only: the lean runtime imports it.
"""

import contextvars
import time

DEADLINE: contextvars.ContextVar = contextvars.ContextVar("rul_deadline", default=None)


class RequestTimedOut(RuntimeError):
    """The request's time ran out; its answer (a 504) has already gone."""


def check() -> None:
    deadline = DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise RequestTimedOut("the request ran past its timeout; its work stopped")

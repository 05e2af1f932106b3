"""Ctrl-C and SIGTERM end the work as exceptions, so every open MLflow run ends KILLED.

The first SIGINT raises KeyboardInterrupt and the first SIGTERM (what schedulers, containers
and `timeout` send) raises Terminated, a KeyboardInterrupt too; any signal after that is
noted and ignored, so that a second Ctrl-C cannot cut the clean-up short and leave a run
RUNNING. Exit codes follow the shell's convention: 130 for SIGINT, 143 for SIGTERM.
"""

import signal
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def exit_code(interruption: KeyboardInterrupt) -> int:
    return 128 + (signal.SIGTERM if isinstance(interruption, Terminated) else signal.SIGINT)


@contextmanager
def interrupts_as_exceptions(on_first_signal=None):
    """Inside the block, SIGINT/SIGTERM raise as above; `on_first_signal()` runs just before
    the first one raises (e.g. to quiet a library's logging of the interruption)."""
    received: list[int] = []

    def handler(signum, frame):
        if received:
            return  # clean-up is running: finish it
        received.append(signum)
        if on_first_signal is not None:
            on_first_signal()
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in previous.items():  # once interrupted, the process is on its way out
            signal.signal(s, signal.SIG_IGN if received else h)

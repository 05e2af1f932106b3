"""Ctrl-C and SIGTERM end the work as exceptions, so every open MLflow run ends KILLED.

The first SIGINT raises KeyboardInterrupt and the first SIGTERM (what schedulers, containers
and `timeout` send) raises Terminated, a KeyboardInterrupt too; any signal after that is
noted and ignored, so that a second Ctrl-C cannot cut the clean-up short and leave a run
RUNNING. Exit codes follow the shell's convention: 130 for SIGINT, 143 for SIGTERM.

An exception raised in the middle of a database write (MLflow's or Optuna's SQLite store)
can leave that database locked, and then the clean-up itself fails. Such writes run inside
`deferred()`: a signal that arrives there is raised as soon as the block ends. Code that
calls into a library that writes (Optuna's optimize) can defer the whole call and mark the
parts where an immediate stop is safe with `immediate()` (a trial's training).
"""

import os
import signal
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def signal_of(interruption: KeyboardInterrupt) -> signal.Signals:
    """The signal an interruption stands for: SIGTERM for Terminated, else SIGINT (also what a
    process passes on to its workers, so that their records say what was done to it)."""
    return signal.SIGTERM if isinstance(interruption, Terminated) else signal.SIGINT


def exit_code(interruption: KeyboardInterrupt) -> int:
    return 128 + signal_of(interruption)


_modes: list[bool] = [True]  # innermost last: True = raise at once, False = defer
_pending: list[KeyboardInterrupt] = []


def _raise_pending() -> None:
    if _pending and _modes[-1]:
        raise _pending.pop()


@contextmanager
def deferred():
    """A signal inside this block is raised when the block ends (never inside it)."""
    _modes.append(False)
    try:
        yield
    finally:
        _modes.pop()
    _raise_pending()


@contextmanager
def immediate():
    """Inside a deferred block: here a signal raises at once (and a pending one now)."""
    _modes.append(True)
    try:
        _raise_pending()
        yield
    finally:
        _modes.pop()


@contextmanager
def interrupts_as_exceptions(on_first_signal=None):
    """Inside the block, SIGINT/SIGTERM raise as above; `on_first_signal()` runs just before
    the first one is raised or deferred (e.g. to quiet a library's logging of it)."""
    received: list[int] = []
    arrivals = _ArrivalOrder()

    def handler(signum, frame):
        if received:
            return  # clean-up is running: finish it
        signum = arrivals.first(signum)
        received.append(signum)
        if on_first_signal is not None:
            on_first_signal()
        interruption = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        if _modes[-1]:
            raise interruption
        _pending.append(interruption)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        arrivals.close()
        _pending.clear()
        for s, h in previous.items():  # once interrupted, the process is on its way out
            signal.signal(s, signal.SIG_IGN if received else h)


class _ArrivalOrder:
    """Which signal arrived first. Python runs its handlers between bytecodes, and when two
    signals arrived during one long C call (a training step) it runs them in signal-number
    order, SIGINT (2) before SIGTERM (15), whatever order they came in. The C-level handler
    writes each signal's number to the wakeup fd as it arrives, so the pipe holds the true
    order. Main thread only (like signal.signal); without a wakeup fd, the handler's signal."""

    def __init__(self):
        self._fds, self._previous = None, None
        try:
            read_end, write_end = os.pipe()
        except OSError:
            return
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        try:
            self._previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_end)
            os.close(write_end)
            return
        self._fds = (read_end, write_end)

    def first(self, signum: int) -> int:
        if self._fds is None:
            return signum
        try:
            arrived = os.read(self._fds[0], 64)
        except BlockingIOError:
            return signum
        return next((b for b in arrived if b in (signal.SIGINT, signal.SIGTERM)), signum)

    def close(self) -> None:
        if self._fds is not None:
            signal.set_wakeup_fd(self._previous)
            for fd in self._fds:
                os.close(fd)
            self._fds = None

"""What a command prints besides its results: warnings as one line of rul's own, and no
library's notes at INFO level about work rul says in its own words (`quiet`).

Python shows a warning as `file:line: Category: message` followed by the line of source that
raised it, which tells a user nothing they can act on. The command line shows each as
`warning: message` (its first line), once per message, on stderr. Libraries' warnings come
through the same way: a real one still reaches the user, without the source line.
"""

import io
import logging
import sys
import traceback
import warnings
from contextlib import contextmanager, redirect_stderr

from rul.urls import scrubbed

_shown: set[str] = set()


def duration(seconds: float) -> str:
    """A time as a person reads it on a progress line: `47 s`, `2.3 min`, `1.5 h`."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip().splitlines()[0] if str(message).strip() else category.__name__
    text = scrubbed(text)
    if text in _shown:
        return
    _shown.add(text)
    print(f"warning: {text}", file=file or sys.stderr)


def one_line_warnings() -> None:
    """Show warnings as `show_warning` does, for the rest of the process; called as a command
    starts, so each command says each warning once (a second command in one process too)."""
    _shown.clear()
    warnings.showwarning = show_warning


# Loggers whose errors are raised to rul too, which says them in one line: MLflow logs every
# failed store operation with its traceback before raising it (a full disk: hundreds of lines).
RAISED_AGAIN = ("mlflow.store.db.utils",)


def no_logged_tracebacks() -> None:
    """Silence RAISED_AGAIN for the rest of the process (their errors still raise)."""
    for name in RAISED_AGAIN:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def masked_tracebacks() -> None:
    """A traceback that ends the process (an error rul did not foresee) is printed with the
    secrets of the URLs the command uses masked (rul.urls.scrubbed)."""

    def show(kind, error, trace) -> None:
        text = "".join(traceback.format_exception(kind, error, trace))
        sys.stderr.write(scrubbed(text))

    sys.excepthook = show


@contextmanager
def quiet(*loggers: str):
    """Inside the block the named loggers say only warnings and errors (their INFO notes
    about work rul reports itself: creating a store's tables, validating an input example)."""
    found = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in found]
    try:
        for logger in found:
            logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
        yield
    finally:
        for logger, level in zip(found, levels, strict=True):
            logger.setLevel(level)


@contextmanager
def said_in_one_line(chatter: tuple[str, ...]):
    """A library call that prints notes on stderr about work the command reports itself:
    its lines holding one of `chatter` are dropped, any other line (a real warning) is
    passed on as it came."""
    caught = io.StringIO()
    try:
        with redirect_stderr(caught):
            yield
    finally:
        for line in caught.getvalue().splitlines():
            if line.strip() and not any(note in line for note in chatter):
                print(line, file=sys.stderr)

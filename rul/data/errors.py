"""Errors raised for bad C-MAPSS input."""

from pathlib import Path

from rul.errors import InputError


class DataError(InputError, ValueError):
    """A C-MAPSS file is missing, malformed or inconsistent. The message names the file."""

    def __init__(self, path: str | Path, problem: str):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class DataUnavailableError(InputError, RuntimeError):
    """The data set is neither available locally nor downloadable."""


SHOWN_CHARS = 40  # characters of a name (a column's, from a file or a request) a message shows


def quoted(name) -> str:
    """A name quoted as Python writes a string (escapes and all: nothing of it reaches a
    terminal raw), cut to SHOWN_CHARS characters (never the whole of what was sent)."""
    text = str(name)
    return repr(text) if len(text) <= SHOWN_CHARS else repr(text[:SHOWN_CHARS - 3]) + "..."

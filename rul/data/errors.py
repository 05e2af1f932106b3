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

"""Errors a user can cause, in a module that imports nothing (so that light tools such as the
benches can raise and catch them without pydantic, mlflow or optuna).

Every error of rul's that is the user's to fix (a config, a data file, a checkpoint, what
`--resume` finds) is an InputError: the command line ends it with its one line and exit code
2, whatever module raised it, without importing that module to recognise it.
"""


class InputError(Exception):
    """Something the user gave or asked for is wrong: one line saying what, exit code 2."""


class ConfigError(InputError, ValueError):
    """A configuration key or value is invalid (one line per problem)."""

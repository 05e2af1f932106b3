"""Errors a user can cause, in a module that imports nothing (so that light tools such as the
benches can raise and catch them without pydantic, mlflow or optuna)."""


class ConfigError(ValueError):
    """A configuration key or value is invalid (one line per problem)."""

"""Which MLflow store a command tracks to, read without importing MLflow (the command line
checks it before the heavy imports): config key > MLFLOW_TRACKING_URI > the default SQLite
store in the working folder. rul.tracking.store makes it ready."""

import os
from pathlib import Path

from rul.urls import with_driver

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3's own default: metadata here, artifacts ./mlruns


def store_uri(tracking_uri: str | None = None) -> str:
    """Config key > MLFLOW_TRACKING_URI > sqlite:///mlflow.db in the working directory."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (None for other stores and in-memory ones)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return None if not path or path.startswith(":memory:") else Path(path)


def for_mlflow(uri: str) -> str:
    """`uri` as rul hands it to MLflow: a PostgreSQL URL with its driver (rul.urls'
    driver rule), a relative SQLite path made absolute (from the working directory now):
    MLflow keeps one store per URI string for the process, so a relative
    `sqlite:///mlflow.db` would keep writing to the folder it was first used in."""
    database = sqlite_path(uri)
    if database is None or database.is_absolute():
        return with_driver(uri)
    _, question, query = uri.partition("?")
    return f"sqlite:///{database.absolute()}{question}{query}"


def missing_folder(uri: str) -> str | None:
    """Why a SQLite store cannot be where `uri` says: its folder does not exist (a mistyped
    path would otherwise start a new, empty store without a word). None when it can."""
    database = sqlite_path(uri)
    if database is None or database.absolute().parent.is_dir():
        return None
    return (f"its folder {database.parent} does not exist (a mistyped path? create the folder "
            "to start a new store there)")


def absent_store(uri: str) -> str | None:
    """Why nothing can be read from `uri`: a SQLite store whose file does not exist (reading
    never creates a store). None when there may be one."""
    database = sqlite_path(uri)
    if database is None or database.is_file():
        return None
    return f"{uri}: no MLflow store there (set --tracking-uri or MLFLOW_TRACKING_URI)"

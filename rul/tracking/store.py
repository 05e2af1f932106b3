"""Which MLflow store to use, and the experiment for a subset."""

import os

import mlflow
from mlflow.tracking import MlflowClient

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3's own default: metadata here, artifacts ./mlruns


def configure(tracking_uri: str | None = None) -> str:
    """Config key > MLFLOW_TRACKING_URI > sqlite:///mlflow.db in the working directory."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    # MLflow draws a progress bar for every tiny artifact it reads back; ours is the epoch bar.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow.set_tracking_uri(uri)
    return uri


def ensure_experiment(name: str) -> str:
    """Create the experiment if needed (once, before any parallel workers) and return its id."""
    client = MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except mlflow.exceptions.MlflowException:  # created meanwhile by another process
        return client.get_experiment_by_name(name).experiment_id

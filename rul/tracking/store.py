"""Which MLflow store to use, and the experiment for a subset."""

import os

import mlflow
from mlflow.tracking import MlflowClient

DEFAULT_URI = "sqlite:///mlflow.db"  # MLflow 3's own default: metadata here, artifacts ./mlruns

# MLflow 3's UI opens an experiment in its GenAI (traces) view unless told otherwise; this tag,
# MLflow's own, makes it open on the runs table and model metrics.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def configure(tracking_uri: str | None = None) -> str:
    """Config key > MLFLOW_TRACKING_URI > sqlite:///mlflow.db in the working directory."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    # MLflow draws a progress bar for every tiny artifact it reads back; ours is the epoch bar.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    mlflow.set_tracking_uri(uri)
    return uri


def ensure_experiment(name: str) -> str:
    """Create the experiment if needed (once, before any parallel workers) and return its id.

    The experiment is tagged as model development, also one made before this tag existed or
    one the UI only guessed a kind for (`*_inferred`); a kind someone chose is kept."""
    client = MlflowClient()
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except mlflow.exceptions.MlflowException:  # created meanwhile by another process
            experiment = client.get_experiment_by_name(name)
    kind = experiment.tags.get(EXPERIMENT_KIND_TAG)
    if kind is None or kind.endswith("_inferred"):
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id

"""Model registry: register every tracked model, move `champion` only on improvement."""

import math

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

CHAMPION = "champion"


def registered_model_name(subset: str) -> str:
    return f"rul-{subset.lower()}"


def register_and_promote(model_uri: str, name: str, run_id: str, val_rmse: float) -> dict:
    """Register `model_uri` as a new version of `name`; point `champion` at it only if its
    validation RMSE beats the current champion's. The comparison is recorded on the run and
    on the version."""
    client = MlflowClient()
    version = mlflow.register_model(model_uri, name)
    client.set_model_version_tag(name, version.version, "val_rmse", repr(float(val_rmse)))
    previous = None
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
        previous = float(champion.tags.get("val_rmse", math.inf))
        previous_version = champion.version
    except MlflowException:
        previous_version = None
    promoted = previous is None or val_rmse < previous
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, version.version)
    record = {"registered_model": name, "registered_version": version.version,
              "champion_promoted": str(promoted).lower(),
              "champion_previous_version": previous_version or "none",
              "champion_previous_val_rmse": "none" if previous is None else repr(previous)}
    for key, value in record.items():
        client.set_tag(run_id, key, value)
    client.set_model_version_tag(name, version.version, "champion_promoted", str(promoted).lower())
    return record

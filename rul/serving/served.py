"""The model `rul predict` and rul's server load: a rul model folder read as data, never run.

A model URI (`models:/...`, `runs:/...`) is downloaded as files; a folder is read where it is.
Either way only its inference spec (JSON) and its members' ONNX files are read, by rul's own
LeanModel (rul.serving.runtime): the folder's code/ (MLflow's models-from-code) and any pickle
in it are never imported. `mlflow.pyfunc.load_model` runs a folder's code, as MLflow documents,
so it is for registries one trusts (docs: Predict and serve). A folder that is not a rul model
with ONNX networks (one logged before the lean runtime, another framework's) is one line.
"""

from pathlib import Path

from rul.serving.request_errors import RequestError
from rul.serving.runtime import LeanModel

LEGACY = ("not a rul model with ONNX networks (no inference/inference_spec.json); one logged "
          "before rul's lean runtime loads only with mlflow.pyfunc.load_model, which runs the "
          "model's code: only from a registry you trust")


def local_model(model_uri: str, folder: str | Path) -> Path:
    """A local folder holding the model: `model_uri` itself, or its files downloaded into
    `folder` (MlflowException when the store does not have it)."""
    if Path(model_uri).is_dir():
        return Path(model_uri)
    import mlflow.artifacts

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri,
                                                    dst_path=str(folder)))


def load(path: str | Path, name: str | None = None, threads: int | None = None) -> LeanModel:
    """The lean model in the local model folder `path`; ValueError in one line naming it (as
    `name`, where given) and what is wrong when it holds none that rul can read."""
    name = name or str(path)
    try:
        return LeanModel.load(path, threads)
    except FileNotFoundError:
        raise ValueError(f"{name}: {LEGACY}") from None
    except Exception as error:  # noqa: BLE001 (the files are data: whatever they hold, one line)
        raise ValueError(f"{name}: not a readable rul model: {_first_line(error)}") from None


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]


class Served:
    """rul's server's model: the lean model behind the contract the scoring path calls (rows
    and params in, a frame out, RequestError for a bad request: one line)."""

    def __init__(self, model: LeanModel):
        self.model = model
        self.columns = model.spec.layout.names  # what it reads: a body's others are not
        self.unit = model.spec.layout.unit  # the column naming a row's engine
        self.optional = model.optional  # the unread sensors, which a body may leave out

    def predict(self, rows, params=None):
        try:
            return self.model.predict(rows, params)
        except ValueError as error:  # DataError included: row, column or unit named
            raise RequestError(str(error)) from None

"""The shipped model: raw C-MAPSS rows in, RUL of each unit at its last cycle out.

Bundles the fitted Preprocessor (pickle), the network's weights and its inference spec, so
`mlflow.pyfunc.load_model("models:/rul-fd001@champion")` needs nothing else. An ensemble's
weights are a list of state dicts, one per member (spec `members`); it predicts their mean and
adds the column `rul_std`, the members' spread. The signature
names the 26 columns but leaves their types to `validate_rows`: MLflow's own enforcement
would reject integer sensor columns (as read from the NASA files) and float unit/cycle.

Output: unit, rul, rul_lower, rul_upper, padded (one row per unit). rul_lower/rul_upper is the
split conformal interval calibrated on the validation units (see rul.evaluation.conformal and
docs: Prediction intervals); a model logged without one (interval_coverage: null, or
logged before intervals existed) returns unit, rul, padded, and its signature says so.
"""

import json
import pickle
from pathlib import Path

import mlflow
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
from mlflow.types.schema import AnyType

from rul.data.schema import COLUMNS
from rul.serving.predictor import InferenceSpec, predict_frame

INPUT_SCHEMA = Schema([ColSpec(AnyType(), c) for c in COLUMNS])
PARAMS_SCHEMA = ParamSchema([ParamSpec("short_history", "string", "pad")])


def signature(intervals: bool = True, members: int = 1) -> ModelSignature:
    """The logged model's signature; `intervals`: its output has rul_lower and rul_upper;
    an ensemble (members > 1) adds rul_std, the members' spread."""
    bounds = [ColSpec("double", "rul_lower"), ColSpec("double", "rul_upper")] if intervals else []
    spread = [ColSpec("double", "rul_std")] if members > 1 else []
    outputs = Schema([ColSpec("long", "unit"), ColSpec("double", "rul"), *bounds,
                      ColSpec("boolean", "padded"), *spread])
    return ModelSignature(inputs=INPUT_SCHEMA, outputs=outputs, params=PARAMS_SCHEMA)


SIGNATURE = signature(intervals=True)


class RULModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        with open(context.artifacts["preprocessor"], "rb") as handle:
            self.preprocessor = pickle.load(handle)
        self.spec = load_spec(context.artifacts, self.preprocessor)
        self.networks = load_networks(self.spec, context.artifacts["weights"])
        self.model = self.networks[0] if len(self.networks) == 1 else self.networks

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        """Bad rows raise an MlflowException carrying validate_rows' message (HTTP 400 when
        served), not a stack trace."""
        short_history = (params or {}).get("short_history", "pad")
        try:
            return predict_frame(self.preprocessor, self.model, model_input,
                                 short_history=short_history,
                                 interval=getattr(self.spec, "interval", None))
        except ValueError as error:  # DataError included
            raise MlflowException(str(error), error_code=INVALID_PARAMETER_VALUE) from None


def load_networks(spec: InferenceSpec, weights_path) -> list[torch.nn.Module]:
    """The spec's networks in eval mode: one state dict, or a list of `spec.members`."""
    saved = torch.load(weights_path, map_location="cpu")
    states = saved if isinstance(saved, list) else [saved]
    if len(states) != spec.members:
        raise ValueError(f"{weights_path}: {len(states)} sets of weights for an inference spec "
                         f"of {spec.members} member(s)")
    networks = []
    for state in states:
        network = spec.build_network()
        network.load_state_dict(state)
        networks.append(network.eval())
    return networks


def load_spec(artifacts: dict, preprocessor) -> InferenceSpec:
    """The inference spec of a logged model (models logged before specs existed stored the
    whole training config: the spec's keys are read from it)."""
    defaults = {"window": preprocessor.window, "rul_cap": preprocessor.rul_cap,
                "n_features": preprocessor.n_features}
    if "inference_spec" in artifacts:
        return InferenceSpec.read(artifacts["inference_spec"], defaults)
    config = json.loads(Path(artifacts["config"]).read_text())
    from rul.models import ARCHITECTURE_ARGS

    architecture = {k: config[k] for k in ARCHITECTURE_ARGS.get(config.get("model"), ())
                    if k in config}
    return InferenceSpec.from_dict({**config, "architecture": architecture}, defaults)

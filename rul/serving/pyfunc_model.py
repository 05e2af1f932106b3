"""Models logged before the lean runtime: raw C-MAPSS rows in, RUL of each unit out, in torch.

Such a model bundles the fitted Preprocessor (pickle), the network's weights and its
inference spec, and the pickled RULModel below; it loads in rul's full environment (torch,
scikit-learn). Models logged now are lean (rul.serving.lean_pyfunc); this class stays so that
every model registered before keeps loading. An ensemble's weights are a list of state
dicts, one per member (spec `members`); it predicts their mean and adds the column `rul_std`.

Output: one row per unit, the served columns (rul.serving.columns) of a model without flags
or p_fail_within (models of this kind predate both): no bounds without an interval.
"""

import json
import pickle
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from rul.preprocessing.features import track
from rul.serving.predictor import predict_frame
from rul.serving.spec import InferenceSpec
from rul.serving.torch_weights import load_networks


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
        params = {"short_history": (params or {}).get("short_history", "pad")}
        try:
            return predict_frame(self.preprocessor, self.model, model_input, params=params,
                                 interval=getattr(self.spec, "interval", None))
        except ValueError as error:  # DataError included
            raise MlflowException(str(error), error_code=INVALID_PARAMETER_VALUE) from None


def load_spec(artifacts: dict, preprocessor) -> InferenceSpec:
    """The inference spec of a logged model (models logged before specs existed stored the
    whole training config: the spec's keys are read from it)."""
    defaults = {"window": preprocessor.window, "rul_cap": preprocessor.rul_cap,
                "n_features": preprocessor.n_features,
                "track": track(getattr(preprocessor, "include_cycle", False))}
    if "inference_spec" in artifacts:
        return InferenceSpec.read(artifacts["inference_spec"], defaults)
    stored = json.loads(Path(artifacts["config"]).read_text())
    from rul.models import ARCHITECTURE_ARGS

    architecture = {k: stored[k] for k in ARCHITECTURE_ARGS.get(stored.get("model"), ())
                    if k in stored}
    return InferenceSpec.from_dict({**stored, "architecture": architecture}, defaults)

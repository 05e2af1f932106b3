"""The served model: rul's lean runtime behind MLflow's pyfunc interface.

Logged as code (MLflow's models-from-code: this file is the model, nothing is pickled) by
rul.tracking.model_logging, with the inference spec and the members' ONNX files as the
artifact `inference` and the rul package as code. Loading imports mlflow's pyfunc base,
numpy, pandas and onnxruntime: no torch, no scikit-learn.

Every bad request, rows or parameters, is one line (RequestError, HTTP 400 when served):
which row, column or unit, and what is wrong; unknown parameters name the allowed ones.
"""

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel

from rul.serving.request_errors import unknown_params, watch_unknown_params
from rul.serving.runtime import RUNTIME_FOLDER, LeanModel
from rul.serving.served import Served


class LeanRULModel(PythonModel):
    def load_context(self, context):
        self.model = LeanModel.load(context.artifacts[RUNTIME_FOLDER])
        watch_unknown_params()

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        return Served(self.model).predict(model_input, {**(params or {}),
                                                        **dict.fromkeys(unknown_params())})


mlflow.models.set_model(LeanRULModel())

"""The served model's signature: its output columns (rul.serving.columns), its request
parameters, and no input schema.

Inputs are the data set's raw columns (rul.data.layout: C-MAPSS's 26, or one's own), checked by
rul.data.validation.validate_rows, which names the row, the column and the problem, also for
missing, extra or renamed columns and for integer sensors or float ids. An input schema would
have MLflow check first and answer with its own message (and its CSV parser would look for
column types the schema cannot give), so the signature declares none; the input example and
the registered model's description show the columns.
"""

from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from rul.serving.columns import served
from rul.serving.predictor import REQUEST_PARAMS

PARAMS_SCHEMA = ParamSchema([ParamSpec(param.name, param.type, param.default)
                             for param in REQUEST_PARAMS])


def signature(interval: str | None = "banded", members: int = 1,
              envelope: bool = True, unit: str = "unit") -> ModelSignature:
    """The signature of a model's output columns (rul.serving.columns.served: which of the
    table's columns, in its order and types, the first under the data set's `unit` name) and
    of its request parameters."""
    outputs = Schema([ColSpec(column.type, column.name)
                      for column in served(interval, members, envelope, unit)])
    return ModelSignature(inputs=None, outputs=outputs, params=PARAMS_SCHEMA)

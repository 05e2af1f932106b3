"""The served model's signature: its input columns, its output columns (rul.serving.columns)
and its request parameters.

Inputs are the data set's raw columns in their order (rul.data.layout: C-MAPSS's 26, or one's
own), each declared of any type and not required: MLflow names them (`get_model_info(...)
.signature`), drops columns it does not declare, with a warning, and hands the rest over as
given, and rul.data.validation.validate_rows checks them, naming the row, the column and the
problem (a missing column, integer sensors, float ids). Typed columns would have MLflow refuse
integer sensors with its own message, before that check.
"""

from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
from mlflow.types.schema import AnyType

from rul.data.layout import CMAPSS, Layout
from rul.serving.columns import served
from rul.serving.predictor import REQUEST_PARAMS

PARAMS_SCHEMA = ParamSchema([ParamSpec(param.name, param.type, param.default)
                             for param in REQUEST_PARAMS])


def signature(interval: str | None = "banded", members: int = 1, envelope: bool = True,
              layout: Layout = CMAPSS) -> ModelSignature:
    """The signature of a model reading the columns of `layout` (the data set's names, in its
    order), of its output columns (rul.serving.columns.served: which of the table's columns,
    in its order and types, the first under the data set's unit name) and of its request
    parameters."""
    outputs = Schema([ColSpec(column.type, column.name)
                      for column in served(interval, members, envelope, layout.unit)])
    return ModelSignature(inputs=Schema([ColSpec(AnyType(), name, required=False)
                                         for name in layout.names]),
                          outputs=outputs, params=PARAMS_SCHEMA)

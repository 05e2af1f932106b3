"""The served model's signature: its output columns (each described in one place), its
request parameters, and no input schema.

Inputs are the 26 raw C-MAPSS columns (rul.data.schema.COLUMNS), checked by
rul.data.validation.validate_rows, which names the row, the column and the problem, also for
missing, extra or renamed columns and for integer sensors or float ids. An input schema would
have MLflow check first and answer with its own message (and its CSV parser would look for
column types the schema cannot give), so the signature declares none; the input example and
the registered model's description show the columns.
"""

from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from rul.serving.predictor import PARAMS

# Every output column: (MLflow type, what it means). The model description lists the columns
# of a model's output schema with these words.
OUTPUT_COLUMNS = {
    "unit": ("long", "the engine's unit number, one row per unit in input order"),
    "rul": ("double", "remaining useful life in cycles at the unit's last cycle, in "
                      "[0, rul_cap]"),
    "rul_lower": ("double", "lower bound of the calibrated prediction interval"),
    "rul_upper": ("double", "upper bound of the calibrated prediction interval"),
    "p_fail_within": ("double", "probability that the engine fails within the request's "
                                "horizon (default 20 cycles), from the calibrated "
                                "predictive distribution"),
    "padded": ("boolean", "the history was shorter than the window and was front-padded"),
    "rul_std": ("double", "spread (standard deviation) of the ensemble members' predictions"),
    "flagged": ("boolean", "the unit lies outside the training fleet (see flag_reason)"),
    "flag_reason": ("string", "why it is flagged: a sensor far beyond the training range, "
                              "unfamiliar settings, missing cycles, a short or late history; "
                              "empty when not flagged"),
}
PARAMS_SCHEMA = ParamSchema([
    ParamSpec("short_history", "string", PARAMS["short_history"]),
    ParamSpec("strict", "boolean", PARAMS["strict"]),
    ParamSpec("horizon", "double", PARAMS["horizon"]),
])


def output_columns(intervals: bool = True, members: int = 1, envelope: bool = True,
                   failure_probability: bool = True) -> list[str]:
    """The output columns in order: bounds with an interval (and p_fail_within with a
    banded one), rul_std for an ensemble, the flags with an envelope."""
    bounds = ["rul_lower", "rul_upper", *(["p_fail_within"] if failure_probability else [])]
    return ["unit", "rul", *(bounds if intervals else []), "padded",
            *(["rul_std"] if members > 1 else []),
            *(["flagged", "flag_reason"] if envelope else [])]


def signature(intervals: bool = True, members: int = 1, envelope: bool = True,
              failure_probability: bool = True) -> ModelSignature:
    outputs = Schema([ColSpec(OUTPUT_COLUMNS[name][0], name)
                      for name in output_columns(intervals, members, envelope,
                                                 failure_probability)])
    return ModelSignature(inputs=None, outputs=outputs, params=PARAMS_SCHEMA)

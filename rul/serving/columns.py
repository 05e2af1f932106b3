"""The served model's output columns, in output order: the one table of them.

Each column's name, MLflow type, meaning (one sentence, for whoever reads the predictions),
which models give it and when it is null in a served answer. The output signature
(rul.serving.signature), the frame every prediction path returns
(rul.serving.predictor.predict_rows: the lean served model, `rul predict`, the torch models),
the registered model's description (rul.tracking.registry) and the serve guide's table
(tests/test_served_columns.py) all read it. Standard library only: the lean
served model imports it.
"""

from dataclasses import dataclass, replace

# Which models give a column (Column.given), in the serve guide's words.
GIVEN = {
    "always": "every model",
    "interval": "models with a calibrated interval",
    "banded": "models with a banded interval (every interval calibrated now)",
    "ensemble": "ensembles",
    "envelope": "models that check inputs against the training fleet (every model logged now)",
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # MLflow's column type: long, double, boolean or string
    meaning: str
    given: str = "always"  # which models give it: a key of GIVEN
    null: str = ""  # when it is null in a served answer (JSON has no NaN); "": never


UNIT = "unit"  # the first column: the engine, under the data set's name of its unit column
COLUMNS = (
    Column(UNIT, "long", "the engine's unit number, one row per unit in input order"),
    Column("rul", "double", "remaining useful life in cycles at the unit's last cycle, in "
                            "[0, rul_cap]"),
    Column("rul_lower", "double", "lower bound of the calibrated prediction interval",
           "interval"),
    Column("rul_upper", "double", "upper bound of the calibrated prediction interval",
           "interval"),
    Column("p_fail_within", "double", "probability that the engine fails within the request's "
                                      "horizon (default 20 cycles), from the calibrated "
                                      "predictive distribution", "banded",
           "the engine has a model input or its settings beyond the training fleet's range: "
           "the calibration cannot speak for it (NaN in Python, empty in `rul predict`'s CSV)"),
    Column("padded", "boolean", "the history was shorter than the window and was "
                                "front-padded"),
    Column("rul_std", "double", "spread (standard deviation) of the ensemble members' "
                                "predictions", "ensemble"),
    Column("flagged", "boolean", "the unit lies outside the training fleet (see flag_reason)",
           "envelope"),
    Column("flag_reason", "string", "why it is flagged: a sensor far beyond the training "
                                    "range, unfamiliar settings, missing cycles, a short or "
                                    "late history; empty when not flagged", "envelope"),
)


def served(interval: str | None = "banded", members: int = 1,
           envelope: bool = True, unit: str = "unit") -> tuple[Column, ...]:
    """The columns of a model, in order: `interval` is the method of its calibrated interval
    (rul.evaluation.conformal.Interval.method; None without one; a banded one also gives the
    probability of failure), `members` its networks, `envelope` whether it has one, `unit`
    the data set's name of its engine column (the first column's name)."""
    has = {"always": True, "interval": interval is not None, "banded": interval == "banded",
           "ensemble": members > 1, "envelope": envelope}
    return tuple(replace(column, name=unit) if column.name == UNIT else column
                 for column in COLUMNS if has[column.given])


def meaning(name: str) -> str:
    """What column `name` means; '' for a name the table does not hold (an older model's)."""
    return next((column.meaning for column in COLUMNS if column.name == name), "")

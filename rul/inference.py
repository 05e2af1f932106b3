"""`rul predict`: read raw rows from a file and predict with a logged model.

Formats: the NASA text file (C-MAPSS's 26 whitespace-separated columns, no header), CSV with
a header naming the columns (any order) and Parquet. The model checks the rows against the
columns it was trained on (its data set's, under their names: rul.data.layout) with
rul.data.validation.validate_rows, the check the training reader and the served model apply;
a CSV without a header gets the line the served model gives the same body.
"""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rul.data.errors import DataError
from rul.data.reader import read_input
from rul.files import INPUT_LIMIT, SizeLimit


@dataclass(frozen=True)
class PredictOptions:
    """How `rul predict` predicts: what to do with short histories, whether a unit outside the
    training fleet refuses the input, and the horizon of p_fail_within (None: the model's
    default, 20 cycles)."""
    short_history: str = "pad"
    strict: bool = False
    horizon: float | None = None
    max_input_mb: float = INPUT_LIMIT.megabytes  # a larger --input is refused unread


def predict_file(model_uri: str, input_path, tracking_uri: str | None = None,
                 options: PredictOptions = PredictOptions()) -> pd.DataFrame:
    """One row per unit, in the file's order, with the model's columns (rul.serving.columns
    says what each means); `strict` refuses the file when a unit lies outside the training
    fleet (flagged, flag_reason). A model logged without an interval has no bounds and no
    probability, one logged before the envelope no flags (and refuses `strict`). The model is
    read as data (rul.serving.served): its folder's code is never run."""
    import tempfile

    import mlflow

    from rul.serving import served
    from rul.tracking.store import configure
    from rul.tracking_uri import absent_store, store_uri

    rows = read_input(input_path, SizeLimit(options.max_input_mb, INPUT_LIMIT.knob))
    uri = store_uri(tracking_uri)
    absent = None if Path(model_uri).exists() else absent_store(uri)  # a folder needs none
    if absent:
        raise ValueError(absent)
    configure(uri, writes=False)  # predicting reads the store: a read-only one serves
    with tempfile.TemporaryDirectory(prefix="rul-model-") as scratch:
        try:
            folder = served.local_model(model_uri, scratch)
        except mlflow.exceptions.MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise ValueError(f"{model_uri}: not in the store {uri} ({error.message})") from None
        model = served.load(folder, model_uri)
    if options.strict and model.spec.envelope is None:
        raise ValueError(f"{model_uri}: this model was logged before rul checked inputs "
                         "against the training fleet; it cannot predict with --strict")
    params = {"short_history": options.short_history, "strict": options.strict}
    if options.horizon is not None:
        params["horizon"] = float(options.horizon)
    return model.predict(rows, params, source=input_path)


def write_predictions(result: pd.DataFrame, output: str | Path) -> None:
    """Write CSV to `output` whole or not at all; its folder must exist."""
    output = Path(output)
    if not output.parent.is_dir():
        raise DataError(output, f"folder {output.parent} does not exist")
    partial = output.with_name(f".{output.name}.partial")
    try:
        result.to_csv(partial, index=False)
        partial.replace(output)
    finally:
        partial.unlink(missing_ok=True)


def outside_warning(result: pd.DataFrame, named: int = 5) -> str | None:
    """One line naming the units flagged outside the training fleet (None: none is)."""
    if "flagged" not in result or not result["flagged"].any():
        return None
    flagged = result[result["flagged"]]
    unit = result.columns[0]  # the data set's name of its unit column
    listed = [f"{unit} {u} ({r})" for u, r in zip(flagged[unit], flagged["flag_reason"])]
    more = f"; and {len(listed) - named} more" if len(listed) > named else ""
    return (f"warning: {len(listed)} of {len(result)} units lie outside the training fleet, "
            f"their predictions are less certain (column flag_reason): "
            f"{'; '.join(listed[:named])}{more}")

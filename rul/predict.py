"""Inference from a logged or registered model on a file of raw C-MAPSS rows."""

from pathlib import Path

import pandas as pd

from rul.data.errors import DataError
from rul.data.reader import read_trajectories
from rul.data.schema import COLUMNS


def read_rows(path: str | Path) -> pd.DataFrame:
    """A C-MAPSS text file (26 unnamed columns) or a CSV with the named columns."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        return read_trajectories(path)
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise DataError(path, f"not a readable CSV: {error}") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(path, f"missing columns {missing}; expected {', '.join(COLUMNS)}")
    return frame[COLUMNS]


def predict_file(model_uri: str, input_path, tracking_uri: str | None = None) -> pd.DataFrame:
    import mlflow

    from rul.tracking.store import configure

    rows = read_rows(input_path)
    configure(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    return model.predict(rows)

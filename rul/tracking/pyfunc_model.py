"""The shipped model: raw C-MAPSS rows in, RUL of each unit at its last cycle out.

Bundles the fitted Preprocessor (pickle) and the network (state dict + the config that builds
it), so `mlflow.pyfunc.load_model("models:/rul-fd001@champion")` needs nothing else.
"""

import json
import pickle
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

from rul.data.schema import COLUMNS

INPUT_SCHEMA = Schema(
    [ColSpec("long", c) for c in COLUMNS[:2]] + [ColSpec("double", c) for c in COLUMNS[2:]]
)
OUTPUT_SCHEMA = Schema([ColSpec("long", "unit"), ColSpec("double", "rul")])
SIGNATURE = ModelSignature(inputs=INPUT_SCHEMA, outputs=OUTPUT_SCHEMA)


class RULModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        from rul import config as cfg
        from rul.models import build_model

        with open(context.artifacts["preprocessor"], "rb") as handle:
            self.preprocessor = pickle.load(handle)
        config = cfg.from_stored(json.loads(Path(context.artifacts["config"]).read_text()))
        self.model = build_model(config, self.preprocessor.n_features)
        self.model.load_state_dict(torch.load(context.artifacts["weights"], map_location="cpu"))
        self.model.eval()

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        return predict_frame(self.preprocessor, self.model, model_input)


def predict_frame(preprocessor, model, rows: pd.DataFrame) -> pd.DataFrame:
    """RUL at the last cycle of each unit in `rows` (any order, one or many engines).

    Give each unit's whole history, not just its last window: sensors are smoothed causally
    from a unit's first row (`smoothing_alpha`), as they were in training.
    """
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"input lacks C-MAPSS columns {missing}")
    if rows.empty:
        raise ValueError("input has no rows")
    rows = rows.sort_values(["unit", "cycle"], kind="stable")
    values = rows[COLUMNS[2:]].to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("input has NaN or infinite sensor/setting values")
    units, windows = preprocessor.last_windows(rows)
    with torch.inference_mode():
        rul = model(torch.as_tensor(windows, dtype=torch.float32)).numpy()
    return pd.DataFrame({"unit": units.astype(np.int64), "rul": rul.astype(np.float64)})


def log_pyfunc(outcome, workdir: Path) -> str:
    """Log the pyfunc model (and the raw torch weights) to the active run; return its URI."""
    workdir.mkdir(parents=True, exist_ok=True)
    preprocessor_path = workdir / "preprocessor.pkl"
    preprocessor_path.write_bytes(pickle.dumps(outcome.data.preprocessor))
    weights_path = workdir / "model.pt"
    torch.save({k: v.cpu() for k, v in outcome.model.state_dict().items()}, weights_path)
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(outcome.config.to_dict()))
    example = outcome.data.subset.test[outcome.data.subset.test["unit"].isin([1, 2])]
    with warnings.catch_warnings():
        # unit and cycle are integers that are never missing: MLflow's hint about NaN in
        # integer columns does not apply.
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer")
        info = mlflow.pyfunc.log_model(
            name="model", python_model=RULModel(),
            artifacts={"preprocessor": str(preprocessor_path), "weights": str(weights_path),
                       "config": str(config_path)},
            signature=SIGNATURE, input_example=example.reset_index(drop=True),
            code_paths=[str(Path(__file__).resolve().parents[1])],  # the rul package
            pip_requirements=_requirements(),
        )
    mlflow.log_artifact(str(weights_path), artifact_path="weights")
    return info.model_uri


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{p}=={version(p)}" for p in ("mlflow", "torch", "pandas", "numpy", "scikit-learn",
                                           "pyyaml", "tqdm")]

"""Log the shipped model to the active MLflow run: the lean model, and the torch weights beside.

The model (`<run>/model`, what gets registered): rul.serving.lean_pyfunc logged as code
(nothing pickled), the artifact `inference/` (the inference spec JSON with the fitted
preprocessing and the envelope as plain numbers, and each member's network as ONNX, exported
from the same weights and checked against them on noise and the run's validation windows; the
served model's test RMSE checked against the run's), the rul package as code, and the lean
requirements: mlflow-skinny, onnxruntime, numpy and pandas at versions a public index serves.

The run also keeps the torch weights for resuming and fine-tuning: `weights/model.pt` (an
ensemble: `weights/ensemble.pt`, a list of its members' state dicts) with the same
`weights/inference_spec.json`; rul.serving.torch_weights loads them.
"""

import warnings
from importlib.metadata import version
from pathlib import Path

import mlflow
import torch

from rul.console import quiet
from rul.serving import lean_pyfunc
from rul.serving.onnx_export import check_served, save_runtime
from rul.serving.runtime import RUNTIME_FOLDER
from rul.serving.signature import signature
from rul.serving.spec import SPEC_FILE, InferenceSpec

# What the served model imports: MLflow's pyfunc base (mlflow-skinny), onnxruntime, numpy,
# pandas. Nothing from training (torch, scikit-learn, tqdm, click, YAML, matplotlib, optuna).
# What the served model needs, pinned to the versions it was logged with: mlflow-skinny to
# load it, onnxruntime, numpy and pandas to run it, and SQLAlchemy with alembic so that
# mlflow-skinny reads the default store (sqlite:///mlflow.db) by alias, as the README's
# `mlflow.pyfunc.load_model("models:/rul-fd001@champion")` does.
INFERENCE_PACKAGES = ("mlflow-skinny", "onnxruntime", "numpy", "pandas", "sqlalchemy",
                      "alembic")
WEIGHTS_FOLDER = "weights"


def log_pyfunc(outcome, workdir: Path) -> str:
    """Log the model of a training or an ensemble (rul.evaluation.ensemble: every member's
    network, one preprocessing) and its torch weights to the active run; return its URI.
    `outcome.interval`: the calibrated rul.evaluation.conformal.Interval, or None (no bounds)."""
    runtime = workdir / RUNTIME_FOLDER
    data, networks, interval = outcome.data, outcome.models, outcome.interval
    layout, test = data.subset.layout, data.subset.test
    spec = save_runtime(runtime, outcome.network_spec, networks, data.preprocessor, interval,
                        data)
    check_served(runtime, layout.external(test), outcome.predictions,
                 outcome.network_spec.rul_cap, outcome.metrics["test_rmse"])
    example = layout.external(test[test["unit"].isin(test["unit"].unique()[:2])])  # 2 units
    with warnings.catch_warnings(), quiet("mlflow.pyfunc", "mlflow.models.model"):
        # unit and cycle are integers that are never missing: MLflow's hint about NaN in
        # integer columns does not apply.
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer")
        info = mlflow.pyfunc.log_model(
            name="model", python_model=lean_pyfunc.__file__,
            artifacts={RUNTIME_FOLDER: str(runtime)},
            signature=signature(interval.method if interval is not None else None,
                                len(networks), layout=layout),
            input_example=example.reset_index(drop=True),
            code_paths=[str(Path(__file__).resolve().parents[1])],  # the rul package
            pip_requirements=requirements(),
        )
    _log_weights(spec, networks, workdir / WEIGHTS_FOLDER)
    return info.model_uri


def _state(network) -> dict:
    return {k: v.cpu() for k, v in network.state_dict().items()}


def _log_weights(spec: InferenceSpec, networks: list, folder: Path) -> None:
    """The torch weights and the spec (without ONNX names) under the run's weights/."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / ("model.pt" if len(networks) == 1 else "ensemble.pt")
    torch.save(_state(networks[0]) if len(networks) == 1 else [_state(n) for n in networks],
               weights)
    InferenceSpec.from_dict({**spec.to_dict(), "onnx": []}).write(folder / SPEC_FILE)
    mlflow.log_artifacts(str(folder), artifact_path=WEIGHTS_FOLDER)


def public_version(package: str) -> str:
    """The installed version without a local tag ('2.13.0+cpu' -> '2.13.0'): local builds
    are served by no public index, the public release of the same version is equivalent."""
    return version(package).split("+", 1)[0]


def requirements() -> list[str]:
    return [f"{p}=={public_version(p)}" for p in INFERENCE_PACKAGES]

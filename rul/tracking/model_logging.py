"""Log the shipped model (rul.serving.pyfunc_model.RULModel) to the active MLflow run.

What is stored: the fitted Preprocessor (pickle), the weights (state dict), a small JSON
inference spec (rul.serving.predictor.InferenceSpec, not the whole training config; it holds
the calibrated prediction interval when the outcome has one), the rul package as code, and
requirements a public index can satisfy. An ensemble stores one list of its members' state
dicts, with the same preprocessor and spec.
"""

import pickle
import warnings
from importlib.metadata import version
from pathlib import Path

import mlflow
import torch

from rul.preprocessing.features import track
from rul.serving.predictor import InferenceSpec
from rul.serving.pyfunc_model import RULModel, signature

# What inference imports; nothing from training (tqdm, click, YAML, matplotlib, optuna).
INFERENCE_PACKAGES = ("mlflow", "torch", "numpy", "pandas", "scikit-learn", "cloudpickle")


def log_pyfunc(outcome, workdir: Path) -> str:
    """Log the pyfunc model (and the raw torch weights) of a training or an ensemble
    (rul.evaluation.ensemble: every member's weights, one preprocessor) to the active run;
    return its URI."""
    return _log_model(outcome.network_spec, outcome.data, outcome.models, outcome.interval,
                      workdir)


def _state(network) -> dict:
    return {k: v.cpu() for k, v in network.state_dict().items()}


def _log_model(spec, data, networks: list, interval, workdir: Path) -> str:
    """`interval`: the calibrated rul.evaluation.conformal.Interval, or None (no bounds)."""
    workdir.mkdir(parents=True, exist_ok=True)
    preprocessor = data.preprocessor
    preprocessor_path = workdir / "preprocessor.pkl"
    preprocessor_path.write_bytes(pickle.dumps(preprocessor))
    members = len(networks)
    weights_path = workdir / ("model.pt" if members == 1 else "ensemble.pt")
    torch.save(_state(networks[0]) if members == 1 else [_state(n) for n in networks],
               weights_path)
    spec_path = workdir / "inference_spec.json"
    InferenceSpec.from_network(spec, interval, members,
                               track(preprocessor.include_cycle)).write(spec_path)
    example = data.subset.test[data.subset.test["unit"].isin([1, 2])]
    with warnings.catch_warnings():
        # unit and cycle are integers that are never missing: MLflow's hint about NaN in
        # integer columns does not apply.
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer")
        info = mlflow.pyfunc.log_model(
            name="model", python_model=RULModel(),
            artifacts={"preprocessor": str(preprocessor_path), "weights": str(weights_path),
                       "inference_spec": str(spec_path)},
            signature=signature(intervals=interval is not None, members=members,
                                failure_probability=getattr(interval, "method", None)
                                == "banded"),
            input_example=example.reset_index(drop=True),
            code_paths=[str(Path(__file__).resolve().parents[1])],  # the rul package
            pip_requirements=requirements(),
        )
    mlflow.log_artifact(str(weights_path), artifact_path="weights")
    return info.model_uri


def public_version(package: str) -> str:
    """The installed version without a local tag ('2.13.0+cpu' -> '2.13.0'): local builds
    are served by no public index, the public release of the same version is equivalent."""
    return version(package).split("+", 1)[0]


def requirements() -> list[str]:
    return [f"{p}=={public_version(p)}" for p in INFERENCE_PACKAGES]

"""`rul train` with tracking: one MLflow run per training, never left RUNNING."""

import platform
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import mlflow
import torch
from mlflow.tracking import MlflowClient

from rul.config import TUNING_KEYS, Config
from rul.data import load_subset
from rul.data.split import rows_of
from rul.experiment import checkpoint_path, load_checkpoint, run_training
from rul.tracking import figures
from rul.tracking.callback import MLflowCallback
from rul.tracking.pyfunc_model import log_pyfunc
from rul.tracking.registry import register_and_promote
from rul.tracking.store import configure, ensure_experiment
from rul.training.seeding import derive_seeds


def train_tracked(config: Config, resume: bool = False, progress: bool = True,
                  parent_run_id: str | None = None, extra_tags: dict | None = None,
                  callback_factory=None, register: bool | None = None,
                  stop_exceptions: tuple[type[BaseException], ...] = ()):
    """Train `config` inside an MLflow run; return (outcome, run_id).

    On any exception (bad data, Ctrl-C, a failure while logging) the run ends FAILED or
    KILLED with the error recorded, and nothing is registered. `stop_exceptions` are stops
    by policy (a pruned tuning trial): the run ends FINISHED, tagged `stopped`, and the
    exception propagates.
    """
    configure(config.tracking_uri)
    experiment_id = ensure_experiment(config.experiment_name)
    resume_from = load_checkpoint(config) if resume else None
    run_id = resume_from.get("mlflow_run_id") if resume_from else None
    client = MlflowClient()
    run = client.create_run(experiment_id, run_name=config.run_name,
                            tags={"mlflow.parentRunId": parent_run_id} if parent_run_id else None
                            ) if run_id is None else client.get_run(run_id)
    run_id = run.info.run_id
    if resume_from:
        client.update_run(run_id, status="RUNNING")
    try:
        with mlflow.start_run(run_id=run_id, nested=parent_run_id is not None):
            outcome = _train_in_run(config, run_id, resume_from, progress, extra_tags,
                                    callback_factory)
            if config.register if register is None else register:
                register_and_promote(outcome.model_uri, f"rul-{config.subset.lower()}", run_id,
                                     outcome.state.best_val_rmse)
    except stop_exceptions as stop:
        client.set_tag(run_id, "stopped", str(stop)[:5000])
        client.set_terminated(run_id, status="FINISHED")
        raise
    except BaseException as error:
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        client.set_tag(run_id, "error", f"{type(error).__name__}: {error}"[:5000])
        client.set_terminated(run_id, status=status)
        raise
    checkpoint_path(config).unlink(missing_ok=True)  # finished: the model lives in MLflow
    return outcome, run_id


def _train_in_run(config, run_id, resume_from, progress, extra_tags, callback_factory):
    seeds = derive_seeds(config.seed)
    subset = load_subset(config.subset, config.data_dir)
    if resume_from is None:
        params = {k: v for k, v in config.to_dict().items() if k not in TUNING_KEYS}
        params.update(effective_batch_size=config.effective_batch_size, world_size=1)
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        mlflow.set_tags({
            **{f"seed.{k}": v for k, v in seeds.as_dict().items()},
            **{f"data.sha256.{role}": d for role, d in subset.file_digests().items()},
            **_environment_tags(), "subset": config.subset, **(extra_tags or {}),
        })
    callback = MLflowCallback(run_id) if callback_factory is None else callback_factory(run_id)
    outcome = run_training(config, callback=callback, resume_from=resume_from,
                           checkpoint_extra={"mlflow_run_id": run_id}, progress=progress,
                           subset=subset)
    callback.flush()
    mlflow.set_tags({"precision_resolved": outcome.precision.name,
                     "device": str(outcome.precision.device)})
    mlflow.log_metrics(outcome.metrics)
    _log_inputs(outcome)
    _log_figures(outcome, run_id)
    with tempfile.TemporaryDirectory() as scratch:
        outcome.model_uri = log_pyfunc(outcome, Path(scratch) / "model")
        outcome.predictions.to_csv(Path(scratch) / "test_predictions.csv", index=False)
        mlflow.log_artifact(str(Path(scratch) / "test_predictions.csv"))
    return outcome


def _log_inputs(outcome) -> None:
    data = outcome.data
    sources = {role: str(path) for role, path in data.subset.files.items()}
    with warnings.catch_warnings():
        # a local path "can be interpreted in multiple ways"; unit/cycle are never missing
        warnings.filterwarnings("ignore", message="The specified dataset source")
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer")
        for context, frame, source in (
            ("training", rows_of(data.subset.train, data.train_units), sources["train"]),
            ("validation", rows_of(data.subset.train, data.val_units), sources["train"]),
            ("testing", data.subset.test, sources["test"]),
        ):
            dataset = mlflow.data.from_pandas(frame, source=source,
                                              name=f"{data.subset.name}-{context}")
            for attempt in range(5):  # parallel tuning workers may insert the same dataset row
                try:
                    mlflow.log_input(dataset, context=context)
                    break
                except mlflow.exceptions.MlflowException as error:
                    if "UNIQUE constraint" not in str(error) or attempt == 4:
                        raise
                    time.sleep(0.2 * (attempt + 1))


def _log_figures(outcome, run_id) -> None:
    import matplotlib.pyplot as plt

    cap = outcome.config.rul_cap
    grad_norms = [m.value for m in sorted(MlflowClient().get_metric_history(run_id, "grad_norm"),
                                          key=lambda m: m.step)]
    for name, fig in (
        ("learning_curves.png", figures.learning_curves(outcome.state.history)),
        ("predicted_vs_true.png", figures.predicted_vs_true(outcome.predictions, cap)),
        ("error_histogram.png", figures.error_histogram(outcome.predictions, cap)),
        ("grad_norm.png", figures.grad_norm_trace(grad_norms, outcome.config.max_grad_norm)),
    ):
        mlflow.log_figure(fig, f"figures/{name}")
        plt.close(fig)


def _environment_tags() -> dict:
    tags = {"torch_version": torch.__version__, "cuda_version": str(torch.version.cuda),
            "python_version": platform.python_version(),
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available()
            else platform.processor() or platform.machine()}
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
        tags.update({"git_commit": commit, "git_dirty": str(bool(dirty)).lower()})
    except (OSError, subprocess.CalledProcessError):
        tags.update({"git_commit": "unknown", "git_dirty": "unknown"})
    return tags

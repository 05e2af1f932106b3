"""`rul train` with tracking: one MLflow run per training, never left RUNNING.

Everything that can be checked runs before the MLflow run exists: the config (when it was
loaded), the data files and the window against the units' lengths. A bad input creates no run.
"""

import getpass
import hashlib
import json
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import mlflow
import torch
from mlflow.tracking import MlflowClient
from mlflow.utils import mlflow_tags

from rul.config import Config
from rul.data.split import rows_of
from rul.interrupts import deferred
from rul.tracking import figures
from rul.tracking.lifecycle import run_ends_cleanly
from rul.tracking.mlflow_listener import MLflowListener
from rul.tracking.pyfunc_model import log_pyfunc
from rul.tracking.registry import register_and_promote, registered_model_name
from rul.tracking.run_checkpoints import RunCheckpoints
from rul.tracking.run_notes import log_run_notes
from rul.tracking.store import configure, ensure_experiment
from rul.training.distributed import current_world, rank_seed
from rul.training.listener import Listeners, TrainingListener
from rul.training.memory import resolve_auto_split, table_rows
from rul.training.precision import resolve_device, resolve_precision
from rul.training.seeding import derive_seeds
from rul.workflow import prepare_data, run_training

# Keys that do not change what is trained (so they are not part of the run's identity).
NON_TRAINING_KEYS = {"data_dir", "tracking_uri", "experiment", "register", "run_name",
                     "checkpoint_dir", "device", "interval_coverage"}
# Architecture keys each model uses; the others are not logged as its params.
MODEL_KEYS = {"cnn": {"filters", "kernel_size", "num_layers", "hidden_size", "dropout"},
              "lstm": {"hidden_size", "num_layers", "dropout"},
              "gru": {"hidden_size", "num_layers", "dropout"},
              "transformer": {"hidden_size", "num_heads", "num_layers", "dropout"}}
ARCHITECTURE_KEYS = set().union(*MODEL_KEYS.values())
CONFIG_DIGEST_TAG = "rul.config_digest"


def config_digest(config: Config) -> str:
    """Same training config -> same digest (what `--resume` looks for)."""
    training = {k: v for k, v in config.to_dict().items() if k not in NON_TRAINING_KEYS}
    return hashlib.sha256(json.dumps(training, sort_keys=True).encode()).hexdigest()[:16]


def default_run_name(config: Config) -> str:
    """What ran, at a glance: e.g. cnn-b512-k2-s42."""
    return (f"{config.model}-b{_global_batch_size(config)}-k{config.accumulation_steps}"
            f"-s{config.seed}")


def train_tracked(config: Config, resume: bool | str = False, progress: bool = True,
                  parent_run_id: str | None = None, run_name: str | None = None,
                  extra_tags: dict | None = None, listener: TrainingListener | None = None,
                  register: bool | None = None, resumable: bool = True, on_run_created=None,
                  stop_exceptions: tuple[type[BaseException], ...] = (), data=None):
    """Train `config` inside an MLflow run; return (outcome, run_id).

    `resume`: True continues the newest unfinished run of this config, a run id that run.
    `resumable=False` (tuning trials) removes the checkpoint however the run ends.
    `on_run_created(run_id)` is called once the MLflow run exists.
    On any exception the run ends FAILED or KILLED with the error recorded and nothing is
    registered; `stop_exceptions` (a pruned trial) end it FINISHED. See lifecycle.py.
    `data`: already prepared (and checked) data, e.g. an ensemble's shared validation split.
    """
    configure(config.tracking_uri)
    precision = resolve_precision(config.precision, resolve_device(config.device),
                                  config.model)
    if data is None:  # data errors, and a window too long for the units, end here
        data = prepare_data(config)
    experiment_id = ensure_experiment(config.experiment_name)
    client = MlflowClient()
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    digest = config_digest(config)  # of the config as written (`auto` stays auto)
    config, split = resolve_auto_split(config, data.preprocessor.n_features, data.train,
                                       precision)  # nothing fits: an error and no run
    with deferred():  # the run and its identity are written whole, or not at all
        run_id = _open_run(config, digest, client, experiment_id, checkpoints, resume,
                           parent_run_id, run_name, extra_tags)
        if on_run_created is not None:
            on_run_created(run_id)
    try:
        tracker = MLflowListener(run_id, amp=precision.use_scaler,
                                 scheduled_lr=config.scheduler != "none",
                                 effective_batch_size=_global_batch_size(config))
        return _train_in_run(config, data, run_id, checkpoints, resume, progress, parent_run_id,
                             extra_tags, Listeners(tracker, listener), register, stop_exceptions,
                             split, precision)
    finally:
        if not resumable:
            checkpoints.remove(run_id)


def _open_run(config, digest, client, experiment_id, checkpoints, resume, parent_run_id,
              run_name, extra_tags=None):
    """The run to train in: a new one, or the one `resume` continues (marked RUNNING).
    A new run is created with its identity tags, the caller's `extra_tags` (e.g. its study and
    trial) included, so a process killed right after creating it leaves no untagged run."""
    if resume:
        run_id = checkpoints.resumable_run(client, experiment_id, digest,
                                           None if resume is True else resume)
        client.update_run(run_id, status="RUNNING")
        return run_id
    tags = {**_source_tags(), **(extra_tags or {}), CONFIG_DIGEST_TAG: digest}
    if parent_run_id:
        tags[mlflow_tags.MLFLOW_PARENT_RUN_ID] = parent_run_id
    name = run_name or config.run_name or default_run_name(config)
    return client.create_run(experiment_id, tags=tags, run_name=name).info.run_id


def _train_in_run(config, data, run_id, checkpoints, resume, progress, parent_run_id,
                  extra_tags, listener, register, stop_exceptions, split, precision):
    with run_ends_cleanly(run_id, stop_exceptions), checkpoints.held(run_id) as checkpointer, \
            mlflow.start_run(run_id=run_id, nested=parent_run_id is not None):
        resume_from = checkpointer.load(resolve_device(config.device)) if resume else None
        if resume_from is not None:
            print(f"resuming run {run_id} after epoch {resume_from['train_state'].epoch}",
                  file=sys.stderr)
        if resume_from is None:
            with deferred():
                _log_params_and_tags(config, data, extra_tags, precision)
                _log_split(split)
        outcome = run_training(config, data, listener=listener,
                               checkpointer=checkpointer, resume_from=resume_from,
                               progress=progress)
        with deferred():  # results, model and registration: whole, then the signal
            _log_results(outcome)
            if config.register if register is None else register:
                register_and_promote(outcome.model_uri, registered_model_name(config.subset),
                                     run_id, outcome.state.best_val_rmse)
    checkpoints.remove(run_id)  # finished: the model lives in MLflow
    return outcome, run_id


def _log_split(split) -> None:
    """micro_batch_size: auto -> what the probe measured and chose (params hold the split)."""
    if split is None:
        return
    mlflow.set_tags({"memory.auto": "true", "memory.budget_bytes": str(split.budget)})
    mlflow.log_metric("memory.chosen_peak_mb", split.peak_bytes / 2**20)
    rows = table_rows(split.table)
    mlflow.log_table({k: [row[k] for row in rows] for k in rows[0]}, "memory_probe.json")


def _log_params_and_tags(config: Config, data, extra_tags: dict | None, precision) -> None:
    unused = ARCHITECTURE_KEYS - MODEL_KEYS[config.model]
    params = {k: v for k, v in config.to_dict().items()
              if v is not None and k not in unused}
    world, seeds = current_world(), derive_seeds(config.seed)
    params.update(effective_batch_size=_global_batch_size(config), world_size=world.size)
    mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
    # units shorter than the window give no training window (a ShortUnitWarning said which)
    dropped = {**data.train.dropped_units, **data.val.dropped_units}
    mlflow.log_metrics({"short_units_dropped": len(dropped),
                        "windows_lost": data.train.windows_lost + data.val.windows_lost})
    if dropped:
        mlflow.set_tag("short_units", ", ".join(f"{u} ({n} rows)" for u, n in dropped.items()))
    log_run_notes(config, data.test)  # padded test units, a short last micro-batch
    mlflow.set_tags({
        **{f"seed.{k}": v for k, v in seeds.as_dict().items()},
        **({f"seed.rank_{r}": rank_seed(seeds.torch, r) for r in range(world.size)}
           if world.distributed else {}),
        **{f"data.sha256.{role}": d for role, d in data.subset.file_digests().items()},
        **_environment_tags(), "subset": config.subset, **(extra_tags or {}),
        "precision.resolved": precision.name, "precision.reason": precision.reason,
    })


def _global_batch_size(config: Config) -> int:
    """micro x K x world size: the samples of one optimizer step over all torchrun ranks."""
    return config.effective_batch_size * current_world().size


def _log_results(outcome) -> None:
    mlflow.set_tag("device", str(outcome.precision.device))
    mlflow.log_metrics(outcome.metrics, step=outcome.state.step)
    _log_inputs(outcome)
    _log_figures(outcome)
    with tempfile.TemporaryDirectory() as scratch:
        outcome.model_uri = log_pyfunc(outcome, Path(scratch) / "model")
        outcome.predictions.to_csv(Path(scratch) / "test_predictions.csv", index=False)
        mlflow.log_artifact(str(Path(scratch) / "test_predictions.csv"))


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


def _log_figures(outcome) -> None:
    for name, fig in (
        ("learning_curves.png", figures.learning_curves(outcome.state.history)),
        ("predicted_vs_true.png", figures.predicted_vs_true(outcome.predictions)),
        ("error_histogram.png", figures.error_histogram(outcome.predictions)),
        ("grad_norm.png", figures.grad_norm_trace(outcome.state.grad_norms,
                                                  outcome.config.max_grad_norm)),
    ):
        mlflow.log_figure(fig, f"figures/{name}")


def _source_tags() -> dict:
    """MLflow's standard source, user and git tags, so the runs table shows them."""
    tags = {mlflow_tags.MLFLOW_SOURCE_NAME: "rul", mlflow_tags.MLFLOW_SOURCE_TYPE: "LOCAL",
            mlflow_tags.MLFLOW_USER: getpass.getuser()}
    commit = _git("rev-parse", "HEAD")
    if commit:
        tags[mlflow_tags.MLFLOW_GIT_COMMIT] = commit
    return tags


def _git(*args) -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _environment_tags() -> dict:
    tags = {"torch_version": torch.__version__, "cuda_version": str(torch.version.cuda),
            "python_version": platform.python_version(),
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available()
            else platform.processor() or platform.machine()}
    commit, dirty = _git("rev-parse", "HEAD"), _git("status", "--porcelain")
    tags.update({"git_commit": commit or "unknown",
                 "git_dirty": "unknown" if dirty is None else str(bool(dirty)).lower()})
    return tags

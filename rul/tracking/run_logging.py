"""What a tracked run records in MLflow: its plan before training (params, seeds, data,
environment, precision, the micro-batch probe) and its outcome after (metrics, datasets,
figures, the model, the test predictions). Everything here writes to the active run."""

import functools
import getpass
import platform
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import mlflow
import pandas as pd
import torch
from mlflow.models import infer_signature
from mlflow.types import ColSpec, Schema
from mlflow.utils import mlflow_tags

from rul.data.schema import COLUMNS
from rul.data.split import rows_of
from rul.evaluation import figures
from rul.machine import machine_tags
from rul.preprocessing.features import track
from rul.tracking.metric_names import logged_metrics
from rul.tracking.model_logging import log_pyfunc
from rul.tracking.run_notes import log_run_notes
from rul.tracking.run_owner import owner_tags
from rul.tracking.run_params import config_params
from rul.tracking.selection import ENGINES_FILE, engines_record, evidence_of
from rul.training.distributed import rank_seed
from rul.training.micro_batch import table_rows

TRACK_TAG = "rul.track"  # sensors | sensors+age: which published figures a run compares with


def data_tags(data) -> dict[str, str]:
    """The data's digests, subset and track, and the odd inputs of its training file
    (`data.odd.<kind>`: the units, or the sensors; rul.preprocessing.odd_inputs)."""
    odd = {f"data.odd.{kind}": ",".join(str(i) for i in items)[:500]
           for kind, items in getattr(data, "odd", {}).items()}
    return {**{f"data.sha256.{role}": d for role, d in data.subset.file_digests().items()},
            "subset": data.subset.name, TRACK_TAG: track(data.preprocessor.include_cycle),
            **odd, **choice_tags(data)}


def choice_tags(data) -> dict[str, str]:
    """What training decided from the data (rul.preprocessing.choices) and how its test set
    and its engines that have not failed were handled: tags under `data.`."""
    tags = {}
    choices, subset = getattr(data, "choices", None), data.subset
    if choices is not None:
        tags.update({"data.conditions": str(choices.n_conditions),
                     "data.conditions.reason": choices.conditions_reason[:500],
                     "data.features": ",".join(data.preprocessor.feature_columns_)[:5000],
                     "data.informative.reason": choices.informative_reason[:500]})
    if subset.layout.names != list(COLUMNS):  # the columns it reads, under their names
        tags["data.columns"] = ",".join(subset.layout.names)[:5000]
    if subset.held_out:
        tags["data.test"] = (f"held out of the training table: {len(subset.held_out)} units "
                             "cut off as C-MAPSS's test units are")
    if subset.censored:
        tags["data.censored"] = ",".join(str(u) for u in subset.censored)[:5000]
    return tags


def log_plan(plan, tags: dict) -> None:
    """A new run's params and tags: what it trains, on what, where and how."""
    config, world, seeds = plan.config, plan.world, plan.seeds
    # units shorter than the window give no training window (a ShortUnitWarning said which)
    dropped = {**plan.data.train.dropped_units, **plan.data.val.dropped_units}
    mlflow.log_params(config_params(
        config, effective_batch_size=plan.global_batch_size, world_size=world.size,
        short_units_dropped=len(dropped),
        windows_lost=plan.data.train.windows_lost + plan.data.val.windows_lost))
    if dropped:
        mlflow.set_tag("short_units", ", ".join(f"{u} ({n} rows)" for u, n in dropped.items()))
    log_run_notes(config, plan.data.test)  # padded test units, a short last micro-batch
    mlflow.log_dict(engines_record([plan.data]), ENGINES_FILE)
    mlflow.set_tags({
        **{f"seed.{k}": v for k, v in seeds.as_dict().items()},
        **({f"seed.rank_{r}": rank_seed(seeds.torch, r) for r in range(world.size)}
           if world.distributed else {}),
        **data_tags(plan.data), **environment_tags(), **tags,
        "precision.resolved": plan.precision.name, "precision.reason": plan.precision.reason,
        mlflow_tags.MLFLOW_RUN_NOTE: run_description(plan),
    })
    _log_split(plan.split)


def run_description(plan) -> str:
    """The run's description in Markdown (shown on the run's page, above its charts): the
    batch as trained, the seeds and the precision."""
    config, seeds = plan.config, plan.seeds
    processes = f" × {plan.world.size} processes" if plan.world.size > 1 else ""
    derived = ", ".join(f"{k} {v}" for k, v in seeds.as_dict().items() if k != "seed")
    return (f"**{config.model}**, effective batch **{plan.global_batch_size}** = micro-batch "
            f"{config.micro_batch_size} × K {config.accumulation_steps}{processes}; "
            f"seed **{seeds.seed}** ({derived}); precision {plan.precision.name}")


def _log_split(split) -> None:
    """micro_batch_size: auto -> what the probe measured and chose (params hold the split)."""
    if split is None:
        return
    mlflow.set_tags({"memory.auto": "true", "memory.budget_bytes": str(split.budget)})
    mlflow.log_param("memory.chosen_peak_mb", f"{split.peak_bytes / 2**20:.1f}")
    rows = table_rows(split.table)
    mlflow.log_table({k: [row[k] for row in rows] for k in rows[0]}, "memory_probe.json")


def log_outcome(outcome) -> None:
    """A finished training's results; sets outcome.model_uri."""
    mlflow.set_tags({"device": str(outcome.plan.precision.device),
                     **evidence_of(outcome).tags()})
    mlflow.log_metrics(logged_metrics(outcome.metrics), step=outcome.state.step)
    _log_inputs(outcome.data)
    log_figures({
        "learning_curves.png": figures.learning_curves(outcome.state.history),
        "predicted_vs_true.png": figures.predicted_vs_true(outcome.predictions),
        "error_histogram.png": figures.error_histogram(outcome.predictions),
        "grad_norm.png": figures.grad_norm_trace(outcome.state.grad_norms,
                                                 outcome.plan.config.max_grad_norm),
    })
    log_model_and_predictions(outcome)


def log_model_and_predictions(outcome) -> None:
    """The pyfunc model (a single network or an ensemble) and the test predictions."""
    with tempfile.TemporaryDirectory() as scratch:
        outcome.model_uri = log_pyfunc(outcome, Path(scratch) / "model")
        outcome.predictions.to_csv(Path(scratch) / "test_predictions.csv", index=False)
        mlflow.log_artifact(str(Path(scratch) / "test_predictions.csv"))


def log_figures(named: dict) -> None:
    for name, fig in named.items():
        mlflow.log_figure(fig, f"figures/{name}")


def _log_inputs(data) -> None:
    sources = {role: str(path) for role, path in data.subset.files.items()}
    sources.setdefault("test", sources["train"])  # held out of the training table
    with warnings.catch_warnings():
        # a local path "can be interpreted in multiple ways"; unit/cycle are never missing
        warnings.filterwarnings("ignore", message="The specified dataset source")
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer")
        for context, frame, source in (
            ("training", rows_of(data.subset.train, data.train_units), sources["train"]),
            ("validation", rows_of(data.subset.train, data.val_units), sources["train"]),
            ("testing", data.subset.test, sources["test"]),
        ):
            dataset = logged_dataset(frame, source, f"{data.subset.name}-{context}")
            for attempt in range(5):  # parallel tuning workers may insert the same dataset row
                try:
                    mlflow.log_input(dataset, context=context)
                    break
                except mlflow.exceptions.MlflowException as error:
                    if "UNIQUE constraint" not in str(error) or attempt == 4:
                        raise
                    time.sleep(0.2 * (attempt + 1))


def logged_dataset(frame: pd.DataFrame, source: str, name: str):
    """MLflow's dataset of a table, its schema given (table_schema) rather than inferred: the
    schema is a functools.cached_property, and the value set here is the one logged."""
    dataset = mlflow.data.from_pandas(frame, source=source, name=name)
    vars(dataset)["schema"] = table_schema(frame)
    return dataset


def table_schema(frame: pd.DataFrame) -> Schema:
    """The schema MLflow infers for a table (each column's type from the first row, required
    where no value is missing), missing values found by one vectorised check per column."""
    first = infer_signature(frame.head(1)).inputs
    missing = frame.isna().any()
    return Schema([ColSpec(type=column.type, name=column.name,
                           required=not bool(missing[column.name])) for column in first.inputs])


def source_tags() -> dict:
    """MLflow's standard source, user and git tags, so the runs table shows them, and the
    process that trains the run (rul.tracking.run_owner)."""
    tags = {mlflow_tags.MLFLOW_SOURCE_NAME: "rul", mlflow_tags.MLFLOW_SOURCE_TYPE: "LOCAL",
            mlflow_tags.MLFLOW_USER: getpass.getuser(), **owner_tags()}
    commit, _ = code_version()
    if commit:
        tags[mlflow_tags.MLFLOW_GIT_COMMIT] = commit
    return tags


@functools.cache
def code_version() -> tuple[str | None, str | None]:
    """(commit, `git status --porcelain`) of the code this process runs, read once, when it
    logs its first run: a long study keeps naming the code it imported, not a newer HEAD."""
    return _git("rev-parse", "HEAD"), _git("status", "--porcelain")


def _git(*args) -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment_tags() -> dict:
    tags = {"cuda_version": str(torch.version.cuda),
            "python_version": platform.python_version(),
            "device_name": torch.cuda.get_device_name() if torch.cuda.is_available()
            else platform.processor() or platform.machine(),
            **machine_tags()}  # CPU model and flags, threads: what the docs' tables show
    commit, dirty = code_version()
    tags.update({"git_commit": commit or "unknown",
                 "git_dirty": "unknown" if dirty is None else str(bool(dirty)).lower()})
    return tags

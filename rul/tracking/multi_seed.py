"""N seeded trainings of one config under one MLflow parent run, never left RUNNING.

Shared by `rul evaluate` (each seed a complete, independent training) and ensembles (each
member a seed, all members on one validation split). The parent is created only after every
seed's data has been prepared and checked, so a bad input creates no run; then each seed trains
as a normal child run (never registered, never resumable) and `summarize` logs what the
parent holds. An interruption ends the child and the parent KILLED, an error FAILED.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import mlflow
from mlflow.tracking import MlflowClient
from mlflow.utils import mlflow_tags

from rul.config import Config
from rul.data import load_subset
from rul.interrupts import deferred
from rul.tracking.lifecycle import run_ends_cleanly
from rul.tracking.run_notes import log_run_notes
from rul.tracking.store import configure, ensure_experiment
from rul.tracking.tracked_run import ARCHITECTURE_KEYS, MODEL_KEYS, _source_tags
from rul.training.seeding import derive_seeds
from rul.workflow import PreparedData, prepare_members

KIND_TAG = "rul.kind"  # evaluate | ensemble (single runs have none)
INDEX_TAG = "rul.seed_index"  # a child's place among the parent's seeds


def spaced_seeds(seed: int, n: int, stride: int = 1) -> list[int]:
    """seed, seed + stride, ..., n of them (stride: the seeds each one uses up)."""
    return [seed + i * stride for i in range(n)]


@dataclass
class SeededRun:
    seed: int
    outcome: object  # a TrainingOutcome, or an EnsembleOutcome for an evaluated ensemble
    run_id: str
    seconds: float  # wall time of this seed's training, logging included


@dataclass
class SeededRuns:
    parent_run_id: str
    runs: list[SeededRun]
    seconds: float  # wall time of all seeds


def prepare_each(config: Config, seeds: list[int]) -> dict[int, list[PreparedData]]:
    """The data (split, fitted preprocessing, windows) of each seed, checked before any run:
    one per ensemble member (rul.workflow.prepare_members), so one for a single model. The
    files are read once."""
    subset = load_subset(config.subset, config.data_dir)
    return {s: prepare_members(config.replace(seed=s), derive_seeds(s), subset) for s in seeds}


def log_config(config: Config, data: PreparedData, params: dict | None = None) -> None:
    """The parent's params (the config, less unused architecture keys) and data tags, on the
    active run, so it compares with single runs in the UI and the registry can describe it."""
    unused = ARCHITECTURE_KEYS - MODEL_KEYS[config.model]
    values = {k: v for k, v in config.to_dict().items() if v is not None and k not in unused}
    values.update(effective_batch_size=config.effective_batch_size, **(params or {}))
    mlflow.log_params({k: str(v)[:6000] for k, v in values.items()})
    mlflow.set_tags({**{f"data.sha256.{role}": d
                        for role, d in data.subset.file_digests().items()},
                     "subset": config.subset})
    log_run_notes(config, data.test)  # padded test units, a short last micro-batch


def train_seeds(config: Config, seeds: list[int], *, kind: str, run_name: str,
                train_one: Callable[[int, int, str], tuple[object, str]],
                summarize: Callable[[SeededRuns], object],
                parent_run_id: str | None = None, tags: dict | None = None):
    """Create the parent run (a child of `parent_run_id` when given), train each seed with
    `train_one(index, seed, parent_run_id) -> (outcome, child_run_id)`, then call
    `summarize(runs)` with the parent as the active run; return (runs, what summarize returned).
    Call it once every seed's data is known good (`prepare_each`)."""
    configure(config.tracking_uri)
    experiment_id = ensure_experiment(config.experiment_name)
    tags = {**_source_tags(), KIND_TAG: kind, "rul.seeds": ",".join(map(str, seeds)),
            **(tags or {})}
    if parent_run_id:
        tags[mlflow_tags.MLFLOW_PARENT_RUN_ID] = parent_run_id
    with deferred():  # the parent is created whole, or not at all
        parent = MlflowClient().create_run(experiment_id, tags=tags, run_name=run_name)
    parent_id = parent.info.run_id
    started, runs = time.perf_counter(), []
    with run_ends_cleanly(parent_id):
        for index, seed in enumerate(seeds):
            seed_started = time.perf_counter()
            outcome, run_id = train_one(index, seed, parent_id)
            runs.append(SeededRun(seed, outcome, run_id, time.perf_counter() - seed_started))
        done = SeededRuns(parent_id, runs, time.perf_counter() - started)
        with deferred(), mlflow.start_run(run_id=parent_id):  # whole, then the signal
            summary = summarize(done)
    return done, summary

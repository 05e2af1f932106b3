"""Result rows: `rul evaluate` parent runs read from an MLflow store, and the committed record of
results measured earlier (docs/data/results.yaml). Both become ResultRecords, the rows of the
Results page.

An evaluation parent run (tag rul.kind=evaluate) holds the config as params, `<metric>_mean`
and `<metric>_std`, the seeds (tag rul.seeds) and MLflow's source tags; the machine, the
resolved precision and the torch version are tags of its seed runs (rul/machine.py). A run
logged before a tag existed shows "n/a" there.
"""

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from rul import config as cfg
from rul.config.recipes import closest_recipe, differences
from rul.reporting.reproduce import evaluate_command, recipe_label
from rul.tracking.metric_names import read
from rul.tracking.parent_run import KIND_TAG, SEEDS_TAG
from rul.tracking.run_params import config_from_params

NA = "n/a"
PARENT_TAG = "mlflow.parentRunId"
COMMIT_TAG = "mlflow.source.git.commit"
METRICS = ("val_rmse", "test_rmse", "test_mae", "test_score", "test_interval_coverage",
           "test_interval_width")
# Where the two tracks differ: the only key left out when recipes are paired side by side.
TRACK_KEY = "include_cycle"
TRACKS = {False: "sensors only", True: "sensors + engine age"}
FEW_SEEDS = 5  # fewer seeds than this: the row says its figures are indicative only


@dataclass
class ResultRecord:
    config: str  # what was evaluated, e.g. "fd001_b32_e150_cycle.yaml + ensemble=5"
    include_cycle: bool
    recipe: str  # the config less the track key and the seed: rows pair on it
    seeds: list[int]
    metrics: dict[str, tuple[float, float | None]]  # metric -> (mean, sample std or None)
    machine: str
    precision: str
    torch: str
    commit: str
    date: str  # YYYY-MM-DD
    command: str
    source: str  # "run <id>" or "recorded"
    note: str = ""
    extra: dict = field(default_factory=dict)
    dataset: str = "FD001"  # the data set's name: C-MAPSS's subset, or a data: section's name

    @property
    def track(self) -> str:
        return TRACKS[self.include_cycle]


def recipe_key(config: cfg.TrainConfig) -> str:
    """The config's training keys less the track key and the seed, as one string."""
    dumped = config.model_dump()
    kept = differences(config, cfg.TrainConfig(), ignore={TRACK_KEY, "seed"})
    return json.dumps({k: dumped[k] for k in sorted(kept)}, default=str)


def machine_text(tags: dict) -> str:
    """CPU model, usable CPUs, notable flags and native bf16, torch threads, GPU; n/a when the
    run predates these tags."""
    if "cpu_model" not in tags:
        return NA
    bf16 = "native bf16" if tags.get("cpu_native_bf16") == "true" else "no native bf16"
    flags = tags.get("cpu_flags", "none")
    text = (f"{tags['cpu_model']}, {tags.get('cpu_count', '?')} CPUs, "
            f"{'' if flags == 'none' else flags + ' '}({bf16}), "
            f"{tags.get('torch_threads', '?')} torch threads")
    gpu = tags.get("gpu_name", "none")
    return text if gpu == "none" else f"{text}, {gpu}"


# ------------------------------------------------------------------ from an MLflow store


def read_evaluations(client) -> list[ResultRecord]:
    """Every finished evaluation parent run of every experiment in the store, newest first."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    runs = client.search_runs(experiments, f"tags.`{KIND_TAG}` = 'evaluate' and "
                              "attributes.status = 'FINISHED'", order_by=["start_time DESC"])
    return [evaluation_record(client, run) for run in runs]


def _seed_run_tags(client, run) -> dict:
    """The tags of the first run below `run` that recorded its environment (a seed's training
    run, or an ensemble member one level further down)."""
    level = [run]
    for _ in range(2):
        below = []
        for parent in level:
            below += client.search_runs([parent.info.experiment_id],
                                        f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'",
                                        order_by=["start_time ASC"])
        for child in below:
            if "torch_version" in child.data.tags:
                return child.data.tags
        level = below
    return {}


def evaluation_record(client, run) -> ResultRecord:
    params, tags, metrics = run.data.params, run.data.tags, run.data.metrics
    config = config_from_params(params)
    config_file, diff = closest_recipe(config)
    seeds = [int(s) for s in tags.get(SEEDS_TAG, "").split(",") if s.strip()]
    n_seeds = int(params.get("seeds", len(seeds) or 1))
    seed_tags = _seed_run_tags(client, run)
    commit = tags.get(COMMIT_TAG, seed_tags.get("git_commit", ""))[:7] or NA
    if seed_tags.get("git_dirty") == "true":
        commit += " + local changes"
    found = {m: (read(metrics, f"{m}_mean"), read(metrics, f"{m}_std"))  # old or new names
             for m in METRICS if read(metrics, f"{m}_mean") is not None}
    started = datetime.fromtimestamp(run.info.start_time / 1000, tz=timezone.utc)
    return ResultRecord(
        config=recipe_label(config_file, diff), include_cycle=config.include_cycle,
        recipe=recipe_key(config), seeds=seeds, metrics=found,
        machine=machine_text(seed_tags), precision=seed_tags.get("precision.resolved", NA),
        torch=seed_tags.get("torch_version", NA), commit=commit,
        date=started.strftime("%Y-%m-%d"), command=evaluate_command(config_file, diff, n_seeds),
        source=f"run {run.info.run_id[:8]}", extra={"run_id": run.info.run_id},
        dataset=config.dataset_name,
        note=f"{n_seeds} seed(s): indicative only" if n_seeds < FEW_SEEDS else "")


# ------------------------------------------------------------------ the committed record


def read_yaml(path: Path) -> dict:
    """A docs/data/*.yaml file's values ({} when empty); invalid YAML is a ConfigError."""
    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as error:
        raise cfg.ConfigError(f"{path}: not valid YAML: {error}") from None


def read_recorded(path: Path) -> tuple[list[ResultRecord], list[dict]]:
    """(records, decisions) of docs/data/results.yaml; a bad entry is a ConfigError naming it."""
    data = read_yaml(path)
    records = []
    for number, entry in enumerate(data.get("records", []), start=1):
        where = f"{path}: record {number}"
        try:
            config_file = entry["config"]
            overrides = entry.get("overrides", {})
            config = cfg.load(Path(__file__).resolve().parents[2] / config_file, overrides)
            metrics = {k: (float(v[0]), None if v[1] is None else float(v[1]))
                       for k, v in entry["metrics"].items()}
            records.append(ResultRecord(
                config=recipe_label(config_file, overrides), include_cycle=config.include_cycle,
                recipe=recipe_key(config), seeds=list(entry["seeds"]), metrics=metrics,
                machine=entry.get("machine", NA), precision=entry.get("precision", NA),
                torch=str(entry.get("torch", NA)), commit=str(entry.get("commit", NA)),
                date=str(entry.get("date", NA)),
                command=evaluate_command(config_file, overrides, len(entry["seeds"])),
                source="recorded", note=entry.get("note", ""), dataset=config.dataset_name))
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise cfg.ConfigError(f"{where}: {error}") from None
    return records, list(data.get("decisions", []))

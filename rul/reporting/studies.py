"""Studies for the Results page: the `rul tune` searches behind the recipes, each with every
trial (its state, validation RMSE, epochs run and sampled values), read from an MLflow store
or from the committed record of studies whose store is gone (docs/data/studies.yaml).

How `rul tune` keeps a study in MLflow is rul.tracking.study_runs; each trial's run also
holds its metrics (`val/best_rmse`, `val/rmse`, `epoch`) and its config as params.

    python -m rul.reporting.studies --tracking-uri sqlite:///gpu/mlflow.db

prints the studies of a store as entries of docs/data/studies.yaml, to be recorded there
before the store is lost (add `config`, `adopted_by` and `note` by hand).
"""

import ast
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from rul import config as cfg
from rul.reporting.records import COMMIT_TAG, NA, PARENT_TAG, machine_text, read_yaml
from rul.tracking import study_runs
from rul.tracking.metric_names import read
from rul.tracking.run_params import config_from_params

STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")  # the table's order
STATE_WORDS = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed",
               "RUNNING": "running", "WAITING": "waiting"}


@dataclass
class Trial:
    number: int
    state: str  # Optuna's TrialState name
    value: float | None  # complete: its best validation RMSE; pruned: the one it stopped at
    epochs_run: int | None
    params: dict  # the sampled values, by search-space key
    reason: str = ""
    baseline: bool = False  # the base config's own values (baseline_trial), not drawn

    def to_dict(self) -> dict:
        return {"number": self.number, "state": self.state, "value": self.value,
                "epochs_run": self.epochs_run, "params": self.params,
                **({"reason": self.reason} if self.reason else {}),
                **({"baseline": True} if self.baseline else {})}


@dataclass
class StudyRecord:
    name: str
    search_space: dict
    trials: list[Trial]
    machine: str
    commit: str
    date: str
    source: str  # "run <id>" or "recorded"
    config: str = ""  # the tuning config that ran it, e.g. experiments/tune_fd001_b512.yaml
    adopted_by: str = ""  # the training config that took its best trial's values
    note: str = ""
    seeds_per_trial: int = 1  # a trial's value is the mean over this many seeds' splits
    logged_counts: dict[str, int] = field(default_factory=dict)  # the parent run's, by state
    extra: dict = field(default_factory=dict)

    @property
    def best(self) -> Trial | None:
        done = [t for t in self.trials if t.state == "COMPLETE" and t.value is not None]
        return min(done, key=lambda t: t.value) if done else None

    def counts(self) -> dict[str, int]:
        """Trials by state: the rows', or the parent run's counts where they are larger (a
        trial pruned before it trained has no run, so no row)."""
        found = {s: max(sum(t.state == s for t in self.trials), self.logged_counts.get(s, 0))
                 for s in STATES}
        return {s: n for s, n in found.items() if n}


# ------------------------------------------------------------------ from an MLflow store


def _space(params: dict) -> dict:
    try:
        space = ast.literal_eval(params.get(study_runs.SEARCH_SPACE, "{}"))
    except (ValueError, SyntaxError):
        return {}
    return space if isinstance(space, dict) else {}


def _value(text: str | None):
    """A param as logged (a string) back to its number where it is one."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _trial(runs: list, space: dict) -> Trial:
    """A trial's row from its runs (one per seed it trained, the first seed's first): a
    complete trial's value is its objective, the mean of its seeds' best validation RMSEs;
    any other's the last one its first seed reported (as Optuna keeps it)."""
    run = runs[0]
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    running = any(r.info.status == "RUNNING" for r in runs)  # perhaps a later seed
    state = tags.get(study_runs.STATE, "RUNNING" if running else "FAIL")
    if state == "COMPLETE":
        values = [read(r.data.metrics, "best_val_rmse") for r in runs]
        value = None if None in values else statistics.fmean(values)
    else:
        value = read(metrics, "val_rmse")
    epochs = metrics.get("epoch")
    return Trial(number=int(tags.get(study_runs.TRIAL, -1)), state=state, value=value,
                 epochs_run=None if epochs is None else int(epochs),
                 params=_sampled(params, space), reason=tags.get(study_runs.REASON, ""),
                 baseline=tags.get(study_runs.BASELINE) == "true")


def _by_trial(children: list) -> list[list]:
    """The trial runs among a study's children, grouped by trial, each group in seed order."""
    groups = {}
    for run in children:
        if study_runs.TRIAL in run.data.tags:
            groups.setdefault(int(run.data.tags[study_runs.TRIAL]), []).append(run)
    return [sorted(runs, key=lambda r: int(r.data.tags.get(study_runs.SEED_INDEX, 0)))
            for _, runs in sorted(groups.items())]


def _sampled(params: dict, space: dict) -> dict:
    """The trial's value of each searched key, from its config as logged (a key at its
    default is not logged: it reads back as the default)."""
    try:
        config = config_from_params(params)
    except cfg.ConfigError:
        config = None
    return {key: getattr(config, key) if hasattr(config, key) else _value(params.get(key))
            for key in space}


def read_studies(client) -> list[StudyRecord]:
    """Every study whose parent run is in the store, newest first."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    parents = [run for run in client.search_runs(
        experiments, f"tags.`{study_runs.STUDY}` != ''", order_by=["start_time DESC"])
        if PARENT_TAG not in run.data.tags]
    return [study_from_run(client, parent) for parent in parents]


def study_from_run(client, parent) -> StudyRecord:
    space = _space(parent.data.params)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    trials = [_trial(runs, space) for runs in _by_trial(children)]
    first = next((run.data.tags for run in children if "torch_version" in run.data.tags), {})
    commit = first.get("git_commit", parent.data.tags.get(COMMIT_TAG, ""))[:7] or NA
    if first.get("git_dirty") == "true":
        commit += " + local changes"
    started = datetime.fromtimestamp(parent.info.start_time / 1000, tz=timezone.utc)
    metrics = parent.data.metrics  # the counts as the study last recorded them
    counts = {s: int(metrics[study_runs.count_metric(s)]) for s in STATES
              if study_runs.count_metric(s) in metrics}
    return StudyRecord(name=parent.data.tags[study_runs.STUDY], search_space=space, trials=trials,
                       machine=machine_text(first), commit=commit,
                       date=started.strftime("%Y-%m-%d"),
                       source=f"run {parent.info.run_id[:8]}",
                       seeds_per_trial=int(parent.data.params.get(study_runs.SEEDS_PER_TRIAL, 1)),
                       logged_counts=counts, extra={"run_id": parent.info.run_id})


def to_record(study: StudyRecord) -> dict:
    """The study as an entry of docs/data/studies.yaml."""
    return {"name": study.name, "config": study.config, "adopted_by": study.adopted_by,
            "machine": study.machine, "commit": study.commit, "date": study.date,
            "note": study.note, "search_space": study.search_space,
            **({"seeds_per_trial": study.seeds_per_trial} if study.seeds_per_trial > 1 else {}),
            "trials": [t.to_dict() for t in study.trials]}


# ------------------------------------------------------------------ the committed record


def read_recorded_studies(path: Path) -> list[StudyRecord]:
    """The studies of docs/data/studies.yaml; a bad entry is a ConfigError naming it."""
    studies = []
    for number, entry in enumerate(read_yaml(path).get("studies", []), start=1):
        try:
            trials = [Trial(number=int(t["number"]), state=str(t["state"]),
                            value=None if t.get("value") is None else float(t["value"]),
                            epochs_run=t.get("epochs_run"), params=dict(t.get("params", {})),
                            reason=str(t.get("reason", "")), baseline=t.get("baseline") is True)
                      for t in entry["trials"]]
            if unknown := sorted({t.state for t in trials} - set(STATES)):
                raise ValueError(f"unknown trial state {unknown[0]!r} (one of "
                                 f"{', '.join(STATES)})")
            studies.append(StudyRecord(
                name=str(entry["name"]), search_space=dict(entry.get("search_space", {})),
                trials=trials, machine=entry.get("machine", NA),
                commit=str(entry.get("commit", NA)), date=str(entry.get("date", NA)),
                source="recorded", config=entry.get("config", ""),
                adopted_by=entry.get("adopted_by", ""), note=entry.get("note", ""),
                seeds_per_trial=int(entry.get("seeds_per_trial", 1))))
        except (KeyError, TypeError, ValueError) as error:
            raise cfg.ConfigError(f"{path}: study {number}: {error}") from None
    return studies


def main(argv: list[str] | None = None) -> None:
    import argparse

    import yaml
    from mlflow.tracking import MlflowClient

    from rul.tracking.store import store_uri
    from rul.tracking_uri import for_mlflow

    parser = argparse.ArgumentParser(prog="python -m rul.reporting.studies",
                                     description="Print a store's studies as entries of "
                                                 "docs/data/studies.yaml.")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args(argv)
    client = MlflowClient(tracking_uri=for_mlflow(store_uri(args.tracking_uri)))
    entries = [to_record(study) for study in read_studies(client)]
    for entry in entries:  # four digits say what a table of two-decimal RMSEs needs
        for trial in entry["trials"]:
            if trial["value"] is not None:
                trial["value"] = round(trial["value"], 4)
    print(yaml.safe_dump({"studies": entries}, sort_keys=False, width=100,
                         default_flow_style=None), end="")


if __name__ == "__main__":
    main()

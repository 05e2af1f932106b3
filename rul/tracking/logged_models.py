"""A logged model read back with the engines it was validated on, and its predictions.

Tools that score logged models after the fact (tools/interval_report.py, tools/age_offsets.py)
need what the run knew: the model (its fitted preprocessor, its networks, its inference spec)
and its validation engines, rebuilt from the run's `seed.split` tag and `val_fraction` param
exactly as the training split them. An ensemble of one shared split gives every member's
prediction; a folds ensemble has no one set of validation engines and is refused.
"""

import argparse
from dataclasses import dataclass

import mlflow
import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rul.data.split import rows_of, split_units
from rul.preprocessing.features import track
from rul.serving.predictor import member_predictions
from rul.serving.torch_weights import load_torch_model
from rul.training.batching import WindowBatches
from rul.training.predict import predict_windows


@dataclass
class LoggedModel:
    run_id: str
    run_name: str
    seed: int
    split_seed: int
    val_fraction: float
    preprocessor: object  # its fitted preprocessing (window_set, last_windows, rul_cap)
    networks: list  # eval-mode networks (one, or an ensemble's members)
    spec: object  # rul.serving.predictor.InferenceSpec
    params: dict  # the run's params (its config)

    @property
    def track(self) -> str:
        return self.spec.track or track(getattr(self.preprocessor, "include_cycle", False))

    def val_units(self, subset) -> np.ndarray:
        return split_units(subset.train["unit"], self.val_fraction, self.split_seed)[1]

    def validation(self, subset):
        """(WindowSet of every full window of the validation engines, member predictions of
        each window: shape (members, windows), float64)."""
        windows = self.preprocessor.window_set(rows_of(subset.train, self.val_units(subset)))
        return windows, self.validation_of(windows)

    def validation_of(self, windows) -> np.ndarray:
        """Each member's prediction of each window of `windows`: (members, windows)."""
        batches = WindowBatches(windows, "cpu")
        return np.stack([predict_windows(n, batches).astype(np.float64)
                         for n in self.networks])

    def last_cycle(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(unit ids, member predictions at each unit's last row: (members, units))."""
        units, windows = self.preprocessor.last_windows(rows)
        return units, member_predictions(self.networks, windows)


def load_logged(run_id: str, client: MlflowClient | None = None) -> LoggedModel:
    """The model logged by run `run_id` (runs:/<id>/model); ValueError naming what is missing."""
    client = client or MlflowClient()
    run = client.get_run(run_id)
    tags, params = run.data.tags, run.data.params
    if params.get("ensemble_split") == "folds":
        raise ValueError(f"run {run_id}: a folds ensemble has no one set of validation engines")
    if "seed.split" not in tags or "val_fraction" not in params:
        raise ValueError(f"run {run_id}: no seed.split tag or val_fraction param (not a rul "
                         "training or ensemble run)")
    try:  # the run's torch weights and spec (models logged with the lean runtime)
        spec, networks = load_torch_model(run_id)
        preprocessor = spec.preprocessing
    except (FileNotFoundError, MlflowException):  # logged before: the pickled torch model
        inner = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").unwrap_python_model()
        spec, networks, preprocessor = inner.spec, list(inner.networks), inner.preprocessor
    return LoggedModel(run_id, run.info.run_name, int(params.get("seed", -1)),
                       int(tags["seed.split"]), float(params["val_fraction"]),
                       preprocessor, list(networks), spec, dict(params))


def runs_under(parent_run_id: str, client: MlflowClient | None = None) -> list[str]:
    """The seeds' run ids of a `rul evaluate` parent run, in seed order."""
    client = client or MlflowClient()
    parent = client.get_run(parent_run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent_run_id}'")
    return [r.info.run_id for r in sorted(children, key=lambda r: int(r.data.params["seed"]))]


REPORT_KIND = "report"  # the rul.kind tag of a run that holds a tool's report


def log_report(text: str, name: str, run_ids: list[str],
               client: MlflowClient | None = None) -> str:
    """Keep a tool's markdown report in the store: a FINISHED run `name` (tag rul.kind=report)
    in the experiment of the first scored run, the report as `<name>.md`, the scored runs in
    the tag rul.report_runs. Returns its run id."""
    client = client or MlflowClient()
    experiment_id = client.get_run(run_ids[0]).info.experiment_id
    run = client.create_run(experiment_id, run_name=name,
                            tags={"rul.kind": REPORT_KIND, "rul.report_runs": ",".join(run_ids)})
    client.log_text(run.info.run_id, text, f"{name}.md")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def tool_arguments(description: str, report_name: str) -> argparse.ArgumentParser:
    """The command line every such tool shares: run ids, --parent (every seed of a `rul
    evaluate` run), --log (keep the report as a run named `report_name`), --subset and
    --data-dir; a tool adds its own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="*", help="training or ensemble run ids")
    parser.add_argument("--parent", action="append", default=[],
                        help="a `rul evaluate` parent run: every seed's run")
    parser.add_argument("--log", action="store_true",
                        help=f"also keep the report in the store: a run named {report_name}")
    parser.add_argument("--subset", default="FD001")
    parser.add_argument("--data-dir", default=None)
    return parser


def named_runs(parser: argparse.ArgumentParser, args) -> list[str]:
    """The run ids the tool's arguments name, read from the configured store; a usage error
    when they name none."""
    from rul.tracking.store import configure

    configure()
    run_ids = [*args.runs, *(r for p in args.parent for r in runs_under(p))]
    if not run_ids:
        parser.error("name runs or --parent")
    return run_ids

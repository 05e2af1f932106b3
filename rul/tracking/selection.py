"""What a registered version is promoted on: the engines its selection score was computed on,
what that score is, the data it came from, and its value (a run's `selection.*` tags). The
champion alias moves only between versions of equal evidence; a challenger on other evidence is
compared by scoring the champion on the challenger's engines, when the champion never trained
on them (docs: Guides, Predict and serve, Promotion).

Each run also keeps the engines it trained, validated on, held out and found in service
(`engines.json`), which is what tells whether a champion trained on an engine.
"""

import hashlib
import json
from dataclasses import dataclass

import mlflow
import numpy as np
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rul.data.split import rows_of
from rul.evaluation.metrics import rmse
from rul.evaluation.truncation import window_weights

ENGINES_FILE = "engines.json"
TAGS = ("selection.engines", "selection.score", "selection.data")  # the key of the evidence


def digest(values) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Evidence:
    engines: tuple  # the selection engines' ids, sorted
    score: str  # what the score is, e.g. "validation RMSE, every window"
    data: str  # a digest of the data files the engines' rows came from
    rmse: float

    @property
    def key(self) -> dict[str, str]:
        return dict(zip(TAGS, (digest(list(self.engines)), self.score, self.data), strict=True))

    def tags(self) -> dict[str, str]:
        return {**self.key, "selection.rmse": repr(float(self.rmse)),
                "selection.engine_count": str(len(self.engines))}


def score_name(val_weights: str, folds: bool) -> str:
    """The selection score's definition, as its tag says it."""
    drawn = ("each engine at test-like truncation points" if val_weights == "truncation"
             else "every window")
    return f"{'out-of-fold ' if folds else ''}validation RMSE, {drawn}"


def evidence_of(outcome) -> Evidence:
    """A trained run's (or ensemble's) evidence: its validation engines (every training engine
    of a folds ensemble, scored out of fold), its score's definition, data and value."""
    config, members = outcome.plan.config, getattr(outcome, "members", None)
    folds = config.ensemble > 1 and config.ensemble_split == "folds"
    engines = sorted({int(u) for m in members or [outcome] for u in m.data.val_units})
    value = outcome.metrics["val_rmse"] if members else outcome.state.best_val_rmse
    return Evidence(tuple(engines), score_name(config.val_weights, folds),
                    digest(outcome.data.subset.file_digests()), float(value))


def key_of(tags: dict) -> dict[str, str] | None:
    """The evidence key a run's or version's tags hold; None when they hold none (an earlier
    rul's)."""
    return {k: tags[k] for k in TAGS} if all(k in tags for k in TAGS) else None


def engines_record(data_list: list) -> dict[str, list[int]]:
    """The engines a run (or an ensemble's members, `data_list`) trained on, validated on,
    held out for test and found in service."""
    def ids(units) -> list[int]:
        return sorted({int(u) for u in units})

    first = data_list[0]
    return {"train": ids(np.concatenate([d.train_units for d in data_list])),
            "validate": ids(np.concatenate([d.val_units for d in data_list])),
            "test": ids(first.test_units), "in_service": ids(first.subset.censored)}


def recorded_engines(run_id: str) -> dict | None:
    """The engines.json run `run_id` logged; None for an earlier rul's run, or one gone."""
    try:
        return mlflow.artifacts.load_dict(f"runs:/{run_id}/{ENGINES_FILE}")
    except (MlflowException, OSError, ValueError):
        return None


@dataclass(frozen=True)
class Challenger:
    """What scoring a champion on a challenger's evidence needs: its selection engines, the
    table their rows come from, and how it weighs their windows."""

    engines: tuple
    rows: object  # the data set's training table (pandas), under rul's column names
    val_weights: str
    split_seed: int  # the draws of test-like weights

    @classmethod
    def of(cls, outcome) -> "Challenger":
        plan = outcome.members[0].plan if hasattr(outcome, "members") else outcome.plan
        return cls(evidence_of(outcome).engines, outcome.data.subset.train,
                   plan.config.val_weights, plan.seeds.split)


def rescored(champion_run_id: str, challenger: Challenger, client: MlflowClient
             ) -> tuple[float | None, str]:
    """The champion's selection score on `challenger`'s engines, rows and definition, or None
    and why it cannot be had honestly (the champion trained on some of those engines, or its
    model or engines cannot be read back)."""
    from rul.tracking.logged_models import load_logged

    trained = set((recorded_engines(champion_run_id) or {}).get("train", ()))
    if not trained:  # an earlier rul's run, or one gone
        return None, "the champion's training engines are not recorded"
    overlap = trained & set(challenger.engines)
    if overlap:
        return None, (f"the champion trained on {len(overlap)} of the challenger's "
                      f"{len(challenger.engines)} validation engines")
    try:
        champion = load_logged(champion_run_id, client)
    except (ValueError, OSError) as error:
        return None, f"the champion cannot be read back ({error})"
    windows = champion.preprocessor.window_set(rows_of(challenger.rows,
                                                       np.asarray(challenger.engines)))
    predicted = champion.validation_of(windows).mean(axis=0)
    weights = window_weights(challenger.val_weights, windows.units, windows.window,
                             challenger.split_seed)
    return float(rmse(predicted, windows.targets, weights)), "scored on the challenger's engines"

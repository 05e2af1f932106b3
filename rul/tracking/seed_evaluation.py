"""`rul evaluate`: how good a config is, as mean ± std over N seeds, not one lucky run.

Seed i trains `config` with seed + i x ensemble (so an ensemble's members never share a seed
with another seed's), a complete training each: its own validation split, weight init and
batch order. Nothing is selected on the test set: each seed's model is the one its own early
stopping kept on its validation units, and every seed is reported. The parent run holds the
aggregates (`<metric>_mean`, `<metric>_std`: sample standard deviation, n - 1; no std for one
seed), the per-seed table `seeds.json` and the wall time; the children are normal training
runs (ensemble runs for ensemble > 1), none registered.
"""

import math
from dataclasses import dataclass

import mlflow
import numpy as np

from rul.config import Config
from rul.tracking.ensemble_run import train_ensemble
from rul.tracking.multi_seed import (
    INDEX_TAG,
    SeededRuns,
    log_config,
    prepare_each,
    spaced_seeds,
    train_seeds,
)
from rul.tracking.tracked_run import default_run_name, train_tracked

REPORTED = ("val_rmse", "test_rmse", "test_mae", "test_score", "test_rmse_uncapped")
INTERVAL_REPORTED = ("test_interval_coverage", "test_interval_width")  # with interval_coverage


@dataclass
class Evaluation:
    parent_run_id: str
    name: str
    rows: list[dict]  # per seed: seed, run_id, REPORTED metrics, seconds
    aggregates: dict  # <metric>_mean, <metric>_std (std only with 2 or more seeds)
    seconds: float


def evaluation_seeds(config: Config, n: int) -> list[int]:
    return spaced_seeds(config.seed, n, stride=config.ensemble)


def reported_metrics(outcome) -> dict[str, float]:
    """A single run's val_rmse is its best epoch's (the model it keeps); an ensemble's is its
    averaged prediction's."""
    m = outcome.metrics
    return {"val_rmse": m["val_rmse"] if "val_rmse" in m else m["best_val_rmse"],
            **{k: m[k] for k in REPORTED[1:]},
            **{k: m[k] for k in INTERVAL_REPORTED if k in m}}


def reported_keys(rows: list[dict]) -> list[str]:
    """REPORTED, and the interval's test coverage and width when every seed has them."""
    return [*REPORTED, *(k for k in INTERVAL_REPORTED if all(k in row for row in rows))]


def aggregate(rows: list[dict], keys=None) -> dict[str, float]:
    found = {}
    for key in keys or reported_keys(rows):
        values = np.array([row[key] for row in rows], dtype=np.float64)
        found[f"{key}_mean"] = float(values.mean())
        if len(values) > 1:
            found[f"{key}_std"] = float(values.std(ddof=1))
    return found


def evaluate_seeds(config: Config, n_seeds: int, progress: bool = True) -> Evaluation:
    if n_seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {n_seeds}")
    seeds = evaluation_seeds(config, n_seeds)
    data = prepare_each(config, seeds)  # every seed's split checked before any run
    name = f"evaluate-{config.run_name or default_run_name(config)}-x{n_seeds}"

    def train_one(index: int, seed: int, parent: str):
        seeded = config.replace(seed=seed, register=False)
        tags = {INDEX_TAG: str(index)}
        if config.ensemble > 1:
            return train_ensemble(seeded, data[seed], progress=progress, parent_run_id=parent,
                                  register=False, extra_tags=tags)
        return train_tracked(seeded, progress=progress, parent_run_id=parent,
                             run_name=f"{config.run_name}-s{seed}" if config.run_name else None,
                             extra_tags=tags, register=False, resumable=False, data=data[seed][0])

    def summarize(runs: SeededRuns) -> Evaluation:
        rows = [{"seed": r.seed, "run_id": r.run_id, **reported_metrics(r.outcome),
                 "seconds": r.seconds} for r in runs.runs]
        evaluation = Evaluation(runs.parent_run_id, name, rows, aggregate(rows), runs.seconds)
        log_config(config, data[seeds[0]][0], {"seeds": n_seeds})
        mlflow.log_metrics({**evaluation.aggregates, "wall_time_s": runs.seconds})
        mlflow.log_table({k: [row[k] for row in rows] for k in rows[0]}, "seeds.json")
        return evaluation

    return train_seeds(config, seeds, kind="evaluate", run_name=name, train_one=train_one,
                       summarize=summarize)[1]


def summary_table(evaluation: Evaluation) -> str:
    """Each seed, then mean ± std, then the wall time."""
    keys = reported_keys(evaluation.rows)
    header = f"{'seed':>6}  " + "  ".join(f"{k:>18}" for k in keys) + f"  {'time':>7}"
    lines = [f"{evaluation.name}: {len(evaluation.rows)} seed(s), nothing selected on the "
             "test set", header]
    for row in evaluation.rows:
        lines.append(f"{row['seed']:>6}  " + "  ".join(f"{row[k]:>18.2f}" for k in keys)
                     + f"  {row['seconds']:>6.0f}s")
    a = evaluation.aggregates
    cells = []
    for key in keys:
        std = a.get(f"{key}_std", math.nan)
        cells.append(f"{a[f'{key}_mean']:>9.2f} ± {std:<6.2f}" if not math.isnan(std)
                     else f"{a[f'{key}_mean']:>18.2f}")
    lines.append(f"{'mean':>6}  " + "  ".join(cells))
    lines.append(f"wall time {evaluation.seconds:.0f} s; parent run {evaluation.parent_run_id}")
    return "\n".join(lines)

"""How good a config is over N seeds: each seed's reported metrics, their mean ± std, the
table `rul evaluate` prints. Nothing here selects on the test set: every seed counts."""

import math
from dataclasses import dataclass

import numpy as np

from rul.evaluation.intervals import TRUE_RUL_BANDS

REPORTED = ("val_rmse", "test_rmse", "test_mae", "test_score", "test_rmse_uncapped")
INTERVAL_REPORTED = ("test_interval_coverage", "test_interval_width")  # with interval_coverage
# the interval by true-RUL band and the failure probability's Brier score (models with a
# banded interval): aggregated on the parent run, printed as one line under the table
BAND_REPORTED = (*(f"test_interval_{what}_{band}" for what in ("coverage", "width")
                   for band in TRUE_RUL_BANDS), "test_p_fail_brier")


@dataclass
class Evaluation:
    parent_run_id: str
    name: str
    rows: list[dict]  # per seed: seed, run_id, REPORTED metrics, seconds
    aggregates: dict  # <metric>_mean, <metric>_std (std only with 2 or more seeds)
    seconds: float
    track: str = ""  # sensors | sensors+age (rul.preprocessing.features.track)


def reported_metrics(outcome) -> dict[str, float]:
    """A single run's val_rmse is its best epoch's (the model it keeps); an ensemble's is its
    averaged prediction's."""
    m = outcome.metrics
    return {"val_rmse": m["val_rmse"] if "val_rmse" in m else m["best_val_rmse"],
            **{k: m[k] for k in REPORTED[1:]},
            **{k: m[k] for k in (*INTERVAL_REPORTED, *BAND_REPORTED) if k in m}}


def reported_keys(rows: list[dict]) -> list[str]:
    """REPORTED, and the interval's test coverage and width when every seed has them."""
    return [*REPORTED, *(k for k in INTERVAL_REPORTED if all(k in row for row in rows))]


def band_keys(rows: list[dict]) -> list[str]:
    """BAND_REPORTED keys every seed has."""
    return [k for k in BAND_REPORTED if all(k in row for row in rows)]


def aggregate(rows: list[dict], keys=None) -> dict[str, float]:
    """<key>_mean and <key>_std (the sample standard deviation, n - 1; none for one row)."""
    found = {}
    for key in keys or [*reported_keys(rows), *band_keys(rows)]:
        values = np.array([row[key] for row in rows], dtype=np.float64)
        found[f"{key}_mean"] = float(values.mean())
        if len(values) > 1:
            found[f"{key}_std"] = float(values.std(ddof=1))
    return found


def summary_table(evaluation: Evaluation) -> str:
    """Each seed, then mean ± std, then the wall time."""
    keys = reported_keys(evaluation.rows)
    header = f"{'seed':>6}  " + "  ".join(f"{k:>18}" for k in keys) + f"  {'time':>7}"
    track = f", track {evaluation.track}" if evaluation.track else ""
    lines = [f"{evaluation.name}: {len(evaluation.rows)} seed(s){track}, nothing selected on "
             "the test set", header]
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
    if all(f"{k}_mean" in a for k in BAND_REPORTED):
        cover, width = ([f"{a[f'test_interval_{what}_{band}_mean']:{form}}"
                         for band in TRUE_RUL_BANDS]
                        for what, form in (("coverage", ".0%"), ("width", ".1f")))
        lines.append(f"interval by true RUL (<= 25 / 26-75 / > 75 cycles), mean: coverage "
                     f"{' / '.join(cover)}, width {' / '.join(width)}; p_fail_within(20) "
                     f"Brier {a['test_p_fail_brier_mean']:.3f}")
    lines.append(f"wall time {evaluation.seconds:.0f} s; parent run {evaluation.parent_run_id}")
    return "\n".join(lines)

"""A model's prediction interval and failure probability: calibrated on its validation engines
truncated as the test units are, reported (never calibrated) on the test units.

The calibration points are the validation windows, weighted by test-like truncation draws so
that each engine counts once (rul.evaluation.truncation). The interval is Mondrian by predicted
RUL (BAND_EDGES), each band's bounds the shortest span of its errors once clipped to
[0, rul_cap] as served (rul.evaluation.conformal, "banded"); the same bands hold the
distribution `Interval.failure_probability` reads (docs: Concepts, Prediction intervals).
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.evaluation.conformal import (
    DEFAULT_HORIZON,
    Interval,
    Spans,
    Weighting,
    fit_banded,
    interval_scores,
)
from rul.evaluation.truncation import truncation_weights

# Upper edges of the predicted-RUL bands, chosen on validation engines (docs: Concepts,
# Prediction intervals): the fewest bands that keep each true-RUL band's coverage and the
# narrowest end-of-life band.
BAND_EDGES = (25.0, 50.0, 75.0, 100.0)
# The share of the errors outside the bounds, as a share of what the coverage leaves out
# (0.7: a 90 % interval holds 93 % of its band's errors), chosen so that validation engines,
# each left out in turn, are covered at the promised rate (docs: Concepts, Prediction intervals).
TAIL_SHARE = 0.7
# How coverage and width are reported: by the true (capped) RUL of the unit.
TRUE_RUL_BANDS = {"rul_le25": (0, 25), "rul_26_75": (26, 75), "rul_gt75": (76, np.inf)}


@dataclass(frozen=True)
class CalibrationSet:
    """Validation windows of engines that ran to failure, in a WindowSet's order: each one's
    prediction, capped target and engine, and the window length."""

    predicted: np.ndarray
    targets: np.ndarray
    units: np.ndarray
    window: int

    @classmethod
    def of(cls, predicted, windows) -> "CalibrationSet":
        """From predictions of a WindowSet's windows."""
        return cls(np.asarray(predicted, dtype=np.float64),
                   np.asarray(windows.targets, dtype=np.float64), np.asarray(windows.units),
                   windows.window)

    @classmethod
    def joined(cls, sets: list["CalibrationSet"]) -> "CalibrationSet":
        """Several sets of distinct engines (an ensemble's folds) as one."""
        return cls(*(np.concatenate([getattr(s, k) for s in sets])
                     for k in ("predicted", "targets", "units")), sets[0].window)


def calibration_level(coverage: float, tail_share: float = TAIL_SHARE) -> float:
    """The central share of the calibration errors the bounds of `coverage` are cut at."""
    return 1 - (1 - coverage) * tail_share


@dataclass(frozen=True)
class IntervalRecipe:
    """How training cuts its interval: the bands by predicted RUL, the tails' share left out
    (calibration_level), each band's shortest span once clipped (`shortest=False`: central)."""

    band_edges: tuple = BAND_EDGES
    tail_share: float = TAIL_SHARE
    shortest: bool = True


def fit_interval(calibration: CalibrationSet, coverage: float, seed: int, rul_cap: float,
                 recipe: IntervalRecipe = IntervalRecipe()) -> Interval:
    """The banded interval of `coverage`, its weights drawn with `seed` (the run's split
    seed), cut by `recipe` with the bounds clipped to [0, rul_cap] as served."""
    weights = truncation_weights(calibration.units, calibration.window, seed)
    spans = Spans(calibration_level(coverage, recipe.tail_share), recipe.shortest, rul_cap)
    return fit_banded(calibration.predicted, calibration.targets, coverage, recipe.band_edges,
                      Weighting(weights, calibration.units), spans)


def interval_metrics(interval: Interval, predicted, true_capped, rul_cap: float,
                     horizon: float = DEFAULT_HORIZON) -> dict[str, float]:
    """Coverage and mean width over the units and per true-RUL band (one with units), and for
    a "banded" interval the Brier score of P(RUL <= horizon) against what happened."""
    predicted, true_capped = (np.asarray(a, dtype=np.float64) for a in (predicted, true_capped))
    lower, upper = interval.bounds(predicted, high=rul_cap)
    overall = interval_scores(lower, upper, true_capped)
    found = {"coverage": overall["coverage"], "width": overall["width"]}
    for name, (low, high) in TRUE_RUL_BANDS.items():
        inside = (true_capped >= low) & (true_capped <= high)
        if inside.any():
            band = interval_scores(lower[inside], upper[inside], true_capped[inside])
            found[f"coverage_{name}"], found[f"width_{name}"] = band["coverage"], band["width"]
    if interval.method == "banded":
        p_fail = interval.failure_probability(predicted, horizon)
        found["p_fail_brier"] = float(np.mean((p_fail - (true_capped <= horizon)) ** 2))
    return found


def calibrate_interval(calibration: Callable[[], CalibrationSet], coverage: float | None,
                       rul_cap: float, seed: int, predictions: pd.DataFrame, metrics: dict
                       ) -> tuple[Interval | None, pd.DataFrame, dict]:
    """The interval of `coverage`, calibrated on `calibration()` (weights drawn with `seed`),
    and new copies of the test `predictions` (predicted_rul, true_rul_capped) and `metrics`
    with what it adds: predicted_rul_lower/_upper (clipped to [0, rul_cap]), p_fail_within at
    DEFAULT_HORIZON; its target, engines and test coverage, width and Brier score. A coverage
    of None: (None, predictions, metrics), `calibration` not called."""
    if coverage is None:
        return None, predictions, metrics
    interval = fit_interval(calibration(), coverage, seed, rul_cap)
    predicted = predictions["predicted_rul"].to_numpy()
    lower, upper = interval.bounds(predicted, high=rul_cap)
    columns = {"predicted_rul_lower": lower, "predicted_rul_upper": upper,
               "p_fail_within": interval.failure_probability(predicted, DEFAULT_HORIZON)}
    test = interval_metrics(interval, predicted, predictions["true_rul_capped"].to_numpy(),
                            rul_cap)
    figures = {"interval_coverage_target": interval.coverage,
               "interval_engines": interval.n_calibration,
               **{f"test_interval_{k}" if not k.startswith("p_fail") else f"test_{k}": v
                  for k, v in test.items()}}
    return interval, predictions.assign(**columns), {**metrics, **figures}

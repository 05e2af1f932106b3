"""A model's prediction interval: calibrated on its validation residuals, applied to its test
predictions, reported (never calibrated) on the test units."""

import pandas as pd

from rul.evaluation.conformal import Interval, fit_conformal, interval_scores


def calibrate_interval(residuals, config, predictions: pd.DataFrame, metrics: dict) -> Interval:
    """Calibrate the split conformal interval of config.interval_coverage on the validation
    windows' `residuals` (predicted - capped target), add its bounds to the test `predictions`
    (columns predicted_rul_lower/_upper, clipped to [0, rul_cap]) and its figures to
    `metrics`; return it.

    A served prediction reads the last window of a unit's history, truncated anywhere; the
    validation units run to failure, so each of their windows is one such truncation point,
    its target the capped RUL the model was trained on. The test units are never used to
    calibrate: their coverage and mean width are reported only.
    """
    interval = fit_conformal(residuals, config.interval_coverage)
    lower, upper = interval.bounds(predictions["predicted_rul"].to_numpy(), high=config.rul_cap)
    predictions["predicted_rul_lower"], predictions["predicted_rul_upper"] = lower, upper
    test = interval_scores(lower, upper, predictions["true_rul_capped"].to_numpy())
    metrics.update(interval_coverage_target=interval.coverage,
                   interval_half_width=interval.half_width,
                   test_interval_coverage=test["coverage"], test_interval_width=test["width"])
    return interval

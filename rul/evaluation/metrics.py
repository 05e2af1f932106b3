"""RUL metrics over all units at once (never a mean of per-batch values)."""

import numpy as np

from rul.preprocessing.target import cap_rul


def rmse(predicted, true, weights=None) -> float:
    """The root of the mean squared error, each error weighted by `weights` when given."""
    d = np.asarray(predicted, dtype=np.float64) - np.asarray(true, dtype=np.float64)
    if weights is not None:
        return float(np.sqrt(np.average(d**2, weights=np.asarray(weights, dtype=np.float64))))
    return float(np.sqrt(np.mean(d**2)))


def mae(predicted, true) -> float:
    d = np.asarray(predicted, dtype=np.float64) - np.asarray(true, dtype=np.float64)
    return float(np.mean(np.abs(d)))


def phm08_score(predicted, true) -> float:
    """PHM08 challenge score: sum of exp(-d/13)-1 for d<0 (early), exp(d/10)-1 for d>=0
    (late), d = predicted - true. Late predictions cost more. Lower is better."""
    d = np.asarray(predicted, dtype=np.float64) - np.asarray(true, dtype=np.float64)
    return float(np.sum(np.where(d < 0, np.expm1(-d / 13.0), np.expm1(d / 10.0))))


def rul_metrics(predicted, true_rul, rul_cap) -> dict[str, float]:
    """The literature's convention: RMSE against the capped true RUL (plus the raw one).

    Keys are unprefixed (rmse, rmse_uncapped, mae, score); callers say which split it was."""
    true_rul = np.asarray(true_rul, dtype=np.float64)
    capped = cap_rul(true_rul, rul_cap)
    return {
        "rmse": rmse(predicted, capped),
        "rmse_uncapped": rmse(predicted, true_rul),
        "mae": mae(predicted, capped),
        "score": phm08_score(predicted, capped),
    }

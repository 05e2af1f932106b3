"""Split conformal prediction intervals: calibrate a half-width on held-out residuals.

Given n calibration residuals r_i = predicted_i - true_i, exchangeable with a new unit's, the
interval pred +- q covers the new truth with probability at least `coverage`, where q is the
k-th smallest score |r_i|, k = ceil((n + 1) * coverage) (the finite-sample conformal
quantile; plain np.quantile(..., method="higher") at k / n picks the (k+1)-th, one too far).

Two scores, so that an ensemble can later give each prediction its own width:
- "absolute": score |r|, interval pred +- q (q in cycles);
- "scaled":   score |r| / spread (spread > 0, e.g. the ensemble's standard deviation),
  interval pred +- q * spread (q in units of spread).

Numpy only: the serving path imports this module.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np

METHODS = ("absolute", "scaled")
_TOLERANCE = 1e-9  # (n + 1) * 0.9 may come out as 9.000000000000002 for n = 9


def conformal_rank(n: int, coverage: float) -> int:
    """k = ceil((n + 1) * coverage): the rank (1-based) of the score that is the half-width."""
    return math.ceil((n + 1) * coverage - _TOLERANCE)


def min_calibration_size(coverage: float) -> int:
    """The fewest residuals for which the conformal quantile is finite (k <= n)."""
    return max(1, math.ceil(coverage / (1 - coverage) - _TOLERANCE))


def conformal_quantile(scores, coverage: float) -> float:
    """The k-th smallest of `scores`, k = ceil((n + 1) * coverage); ValueError when k > n
    (too few scores to promise `coverage`)."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if not 0 < coverage < 1:
        raise ValueError(f"coverage must be strictly between 0 and 1, got {coverage!r}")
    if not np.isfinite(scores).all():
        raise ValueError("calibration scores must be finite")
    n = len(scores)
    k = conformal_rank(n, coverage)
    if k > n:
        raise ValueError(f"coverage {coverage} needs at least {min_calibration_size(coverage)} "
                         f"calibration residuals, got {n}")
    return float(np.partition(scores, k - 1)[k - 1])


@dataclass(frozen=True)
class Interval:
    """A fitted conformal interval: stored with the model (InferenceSpec JSON) as a dict."""

    coverage: float  # the target, e.g. 0.9
    half_width: float  # the conformal quantile of the score (cycles for "absolute")
    n_calibration: int  # residuals it was calibrated on
    method: str = "absolute"

    def bounds(self, predicted, spread=None, low: float = 0.0,
               high: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) around `predicted`, clipped to [low, high] like the prediction."""
        predicted = np.asarray(predicted, dtype=np.float64)
        width = self.half_width * _spread(self.method, spread, predicted.shape)
        upper_clip = np.inf if high is None else high
        return (np.clip(predicted - width, low, upper_clip),
                np.clip(predicted + width, low, upper_clip))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Interval":
        """Read a stored interval; ValueError naming what is wrong."""
        if not isinstance(values, dict):
            raise ValueError(f"interval must be a mapping, got {values!r}")
        missing = [k for k in ("coverage", "half_width", "n_calibration") if k not in values]
        if missing:
            raise ValueError(f"interval lacks {missing}")
        interval = cls(float(values["coverage"]), float(values["half_width"]),
                       int(values["n_calibration"]), str(values.get("method", "absolute")))
        if interval.method not in METHODS:
            raise ValueError(f"interval: unknown method {interval.method!r} (known: {METHODS})")
        if not (0 < interval.coverage < 1 and math.isfinite(interval.half_width)
                and interval.half_width >= 0):
            raise ValueError(f"interval: coverage {interval.coverage} or half_width "
                             f"{interval.half_width} out of range")
        return interval


def fit_conformal(residuals, coverage: float, spread=None) -> Interval:
    """Calibrate on `residuals` (predicted - true): the "absolute" interval, or the "scaled"
    one when each residual comes with its prediction's `spread`."""
    residuals = np.asarray(residuals, dtype=np.float64).ravel()
    method = "absolute" if spread is None else "scaled"
    scores = np.abs(residuals) / _spread(method, spread, residuals.shape)
    return Interval(float(coverage), conformal_quantile(scores, coverage), len(residuals),
                    method)


def interval_scores(lower, upper, true) -> dict[str, float]:
    """Empirical coverage (share of `true` inside [lower, upper]) and mean width."""
    lower, upper, true = (np.asarray(a, dtype=np.float64) for a in (lower, upper, true))
    return {"coverage": float(np.mean((lower <= true) & (true <= upper))),
            "width": float(np.mean(upper - lower))}


def _spread(method: str, spread, shape) -> np.ndarray | float:
    if method == "absolute":
        if spread is not None:
            raise ValueError("an absolute interval takes no spread")
        return 1.0
    if spread is None:
        raise ValueError("a scaled interval needs each prediction's spread")
    spread = np.broadcast_to(np.asarray(spread, dtype=np.float64), shape)
    if not (np.isfinite(spread).all() and (spread > 0).all()):
        raise ValueError("spread must be finite and > 0")
    return spread

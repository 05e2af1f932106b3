"""Split conformal prediction intervals, and the predictive distribution behind them.

Given n calibration residuals r_i = predicted_i - true_i, exchangeable with a new unit's, the
interval pred +- q covers the new truth with probability at least `coverage`, q the k-th
smallest |r_i|, k = ceil((n + 1) * coverage) (np.quantile at k / n picks one too far).

Methods (`Interval.method`): "absolute", pred +- q (q in cycles); "scaled", score |r| / spread
(spread > 0: an ensemble's standard deviation), pred +- q * spread; "banded", Mondrian by
predicted RUL: each band's weighted errors e = true - predicted (each engine counting once)
give its bounds at a `level` the caller measures (rul.evaluation.intervals) and the predictive
distribution pred + e that `failure_probability` reads (docs: Concepts, Prediction intervals).

Numpy only: the serving path imports this module.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np

METHODS = ("absolute", "scaled", "banded")
ERROR_LEVELS = np.linspace(0.0, 1.0, 101)  # the banded predictive distribution's quantile levels
DEFAULT_HORIZON = 20.0  # cycles: failure_probability's horizon unless a request names one
SPAN_STEPS = 41  # shortest spans tried per band (odd: the central one is among them)
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


def weighted_quantile(values, weights, level: float) -> float:
    """The smallest value whose share of the total weight at or below it reaches `level`;
    +inf above level 1 (the conformal "one more point at infinity"), -inf below 0."""
    if level > 1:
        return math.inf
    if level < 0:
        return -math.inf
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    share = np.cumsum(weights[order]) / weights.sum()
    return float(values[order][min(np.searchsorted(share, level - _TOLERANCE), len(values) - 1)])


@dataclass(frozen=True)
class Interval:
    """A fitted conformal interval: stored with the model (InferenceSpec JSON) as a dict."""

    coverage: float  # the target, e.g. 0.9
    half_width: float | None  # "absolute"/"scaled": the score's conformal quantile
    n_calibration: int  # residuals it was calibrated on ("banded": engines)
    method: str = "absolute"
    band_edges: tuple[float, ...] = ()  # "banded": upper edges of the predicted-RUL bands
    lower: tuple[float, ...] = ()  # "banded": per band, the lower bound's offset (cycles)
    upper: tuple[float, ...] = ()  # "banded": per band, the upper bound's offset (cycles)
    errors: tuple[tuple[float, ...], ...] = ()  # "banded": per band, e quantiles at ERROR_LEVELS

    def band(self, predicted) -> np.ndarray:
        """The band of each prediction ("banded"): i where edges[i-1] < predicted <= edges[i]."""
        return np.searchsorted(np.asarray(self.band_edges, dtype=np.float64),
                               np.asarray(predicted, dtype=np.float64), side="left")

    def bounds(self, predicted, spread=None, low: float = 0.0,
               high: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) around `predicted`, clipped to [low, high] like the prediction."""
        predicted = np.asarray(predicted, dtype=np.float64)
        upper_clip = np.inf if high is None else high
        if self.method == "banded":
            _no_spread(spread)
            band = self.band(predicted)
            lower = predicted + np.asarray(self.lower)[band]
            upper = predicted + np.asarray(self.upper)[band]
        else:
            width = self.half_width * _spread(self.method, spread, predicted.shape)
            lower, upper = predicted - width, predicted + width
        return np.clip(lower, low, upper_clip), np.clip(upper, low, upper_clip)

    def failure_probability(self, predicted, horizon: float, spread=None) -> np.ndarray:
        """P(true RUL <= horizon) for each prediction, from its band's distribution pred + e
        (linear between the stored quantiles); only a "banded" interval stores one."""
        if self.method != "banded":
            raise ValueError(f"a {self.method!r} interval stores no predictive distribution")
        _no_spread(spread)
        predicted = np.asarray(predicted, dtype=np.float64)
        gap = float(horizon) - predicted  # true <= horizon <=> e <= horizon - predicted
        band = self.band(predicted)
        probability = np.empty(predicted.shape)
        for index, quantiles in enumerate(self.errors):
            inside = band == index
            probability[inside] = _cdf(np.asarray(quantiles), gap[inside])
        return probability

    def to_dict(self) -> dict:
        """The stored form; an "absolute" or "scaled" interval writes the keys it always had."""
        values = asdict(self)
        if self.method != "banded":
            for key in ("band_edges", "lower", "upper", "errors"):
                del values[key]
        else:
            del values["half_width"]
            values.update(band_edges=list(self.band_edges), lower=list(self.lower),
                          upper=list(self.upper), errors=[list(e) for e in self.errors])
        return values

    @classmethod
    def from_dict(cls, values: dict) -> "Interval":
        """Read a stored interval; ValueError naming what is wrong."""
        if not isinstance(values, dict):
            raise ValueError(f"interval must be a mapping, got {values!r}")
        method = str(values.get("method", "absolute"))
        if method not in METHODS:
            raise ValueError(f"interval: unknown method {method!r} (known: {METHODS})")
        needed = (("coverage", "n_calibration", "band_edges", "lower", "upper", "errors")
                  if method == "banded" else ("coverage", "half_width", "n_calibration"))
        missing = [k for k in needed if k not in values]
        if missing:
            raise ValueError(f"interval lacks {missing}")
        if method == "banded":
            interval = _read_banded(values)
            if not 0 < interval.coverage < 1:
                raise ValueError(f"interval: coverage {interval.coverage} out of range")
            return interval
        interval = cls(float(values["coverage"]), float(values["half_width"]),
                       int(values["n_calibration"]), method)
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


@dataclass(frozen=True)
class Weighting:
    """Each calibration point's weight (default equal) and engine (default: every point its
    own; the engines are counted in n_calibration)."""

    weights: object = None
    engines: object = None

    def of(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        weights = (np.ones(n) if self.weights is None
                   else np.asarray(self.weights, dtype=np.float64).ravel())
        engines = np.arange(n) if self.engines is None else np.asarray(self.engines).ravel()
        return weights, engines


@dataclass(frozen=True)
class Spans:
    """How a band's bounds are cut from its errors: `level` (default and at least the
    coverage) is the share of the errors they hold; `shortest` picks, instead of the central
    span, the one narrowest once clipped to [0, `high`] (None: no upper clip)."""

    level: float | None = None
    shortest: bool = False
    high: float | None = None

    def bounds(self, errors, weights, predicted, level: float) -> tuple[float, float]:
        if self.shortest:
            return _shortest_span(errors, weights, predicted, level, self.high)
        return _span(errors, weights, (1 - level) / 2, level)


def fit_banded(predicted, true, coverage: float, band_edges,
               weighting: Weighting = Weighting(), spans: Spans = Spans()) -> Interval:
    """The "banded" interval of `coverage` from calibration predictions and their true (capped)
    RUL, weighed by `weighting`, each band's bounds cut by `spans` (a band without calibration
    points takes all of them) and always containing the prediction; the stored distribution's
    quantile at p is the errors' at 0.5 + (p - 0.5) x level / coverage."""
    predicted = np.asarray(predicted, dtype=np.float64).ravel()
    errors = np.asarray(true, dtype=np.float64).ravel() - predicted
    weights, engines = weighting.of(len(errors))
    level = coverage if spans.level is None else spans.level
    _check_calibration(coverage, level, errors, weights)
    edges = tuple(float(e) for e in band_edges)
    if list(edges) != sorted(set(edges)):
        raise ValueError(f"band edges must increase, got {list(edges)}")
    band = Interval(float(coverage), None, 0, "banded", edges).band(predicted)
    lower, upper, quantiles = [], [], []
    used = weights > 0
    stretched = 0.5 + (ERROR_LEVELS - 0.5) * level / coverage
    for index in range(len(edges) + 1):
        inside = (band == index) & used
        if not inside.any():
            inside = used
        e, w = errors[inside], weights[inside]
        low, up = spans.bounds(e, w, predicted[inside], level)
        lower.append(low)
        upper.append(up)
        quantiles.append(tuple(float(e.min()) if p <= 0 else weighted_quantile(e, w, min(p, 1))
                               for p in stretched))
    return Interval(float(coverage), None, len(np.unique(engines[used])), "banded", edges,
                    tuple(lower), tuple(upper), tuple(quantiles))


def _check_calibration(coverage: float, level: float, errors, weights) -> None:
    if not 0 < coverage <= level < 1:
        raise ValueError(f"coverage must be strictly between 0 and 1 and level between it and "
                         f"1, got {coverage!r} and {level!r}")
    if not (np.isfinite(errors).all() and np.isfinite(weights).all() and (weights >= 0).all()
            and weights.sum() > 0):
        raise ValueError("calibration errors and weights must be finite, weights >= 0, "
                         "not all 0")


def _span(errors, weights, below: float, level: float) -> tuple[float, float]:
    """The bounds (offsets) that leave `below` of the weighted errors under the lower one and
    hold `level` of them, widened to hold the prediction itself."""
    return (min(0.0, -weighted_quantile(-errors, weights, 1 - below)),
            max(0.0, weighted_quantile(errors, weights, below + level)))


def _shortest_span(errors, weights, predicted, level: float,
                   high: float | None) -> tuple[float, float]:
    """Of SPAN_STEPS spans of `level` of the errors, the one whose bounds around `predicted`,
    clipped to [0, high], are narrowest in weighted mean (the most central of equals)."""
    high = math.inf if high is None else high
    best = None
    for below in np.linspace(0.0, 1.0 - level, SPAN_STEPS):
        low, up = _span(errors, weights, below, level)
        clipped = np.clip(predicted + up, 0.0, high) - np.clip(predicted + low, 0.0, high)
        width = np.average(clipped, weights=weights)
        key = (round(float(width), 9), abs(below - (1 - level) / 2))
        if best is None or key < best[0]:
            best = (key, (low, up))
    return best[1]


def interval_scores(lower, upper, true) -> dict[str, float]:
    """Empirical coverage (share of `true` inside [lower, upper]) and mean width."""
    lower, upper, true = (np.asarray(a, dtype=np.float64) for a in (lower, upper, true))
    return {"coverage": float(np.mean((lower <= true) & (true <= upper))),
            "width": float(np.mean(upper - lower))}


def _cdf(quantiles: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(e <= x) from e's quantiles at ERROR_LEVELS: linear between them, right-continuous
    at ties (a repeated quantile takes its highest level)."""
    last = np.r_[quantiles[1:] != quantiles[:-1], True]
    return np.interp(x, quantiles[last], ERROR_LEVELS[last], left=0.0, right=1.0)


def _read_banded(values: dict) -> Interval:
    try:
        edges = tuple(float(e) for e in values["band_edges"])
        lower = tuple(float(v) for v in values["lower"])
        upper = tuple(float(v) for v in values["upper"])
        errors = tuple(tuple(float(v) for v in band) for band in values["errors"])
    except (TypeError, ValueError):
        raise ValueError("interval: band_edges, lower, upper and errors must be lists of "
                         "numbers") from None
    bands = len(edges) + 1
    if not (len(lower) == len(upper) == len(errors) == bands
            and all(len(e) == len(ERROR_LEVELS) for e in errors)):
        raise ValueError(f"interval: {bands} band(s) need {bands} lower, upper and errors "
                         f"entries of {len(ERROR_LEVELS)} quantiles each")
    numbers = np.array([*edges, *lower, *upper, *(v for e in errors for v in e)])
    if not (np.isfinite(numbers).all() and all(lo <= up for lo, up in zip(lower, upper))
            and list(edges) == sorted(set(edges))
            and all(list(e) == sorted(e) for e in errors)):
        raise ValueError("interval: band edges, bounds or error quantiles out of order")
    return Interval(float(values["coverage"]), None, int(values["n_calibration"]), "banded",
                    edges, lower, upper, errors)


def _no_spread(spread) -> None:
    if spread is not None:
        raise ValueError("a banded interval takes no spread")


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

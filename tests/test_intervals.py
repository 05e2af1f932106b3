"""Prediction intervals: the conformal math, the calibration split (test-like truncation
points), the bands and the failure probability, the config key, the stored spec, a trained
model's bounds and p_fail_within through MLflow (pyfunc by URI, `rul predict`), and FD001's
test coverage and reliability (slow)."""

import json
import math
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.cli import main
from rul.data.reader import read_input
from rul.evaluation import figures
from rul.evaluation.conformal import (
    ERROR_LEVELS,
    Interval,
    Spans,
    Weighting,
    conformal_quantile,
    fit_banded,
    fit_conformal,
    interval_scores,
    min_calibration_size,
    weighted_quantile,
)
from rul.evaluation.intervals import (
    BAND_EDGES,
    TAIL_SHARE,
    CalibrationSet,
    IntervalRecipe,
    calibration_level,
    fit_interval,
)
from rul.evaluation.truncation import LIFE_FRACTION, truncation_points, truncation_weights
from rul.serving.predictor import InferenceSpec, predict_frame
from rul.tracking.metric_names import logged
from rul.workflows.train import train_tracked

ROOT = Path(__file__).resolve().parents[1]
CONFIG_PATH = ROOT / "experiments" / "fd001_age.yaml"  # the age track: tag and spec say so
TINY = {"epochs": 2, "window": 10, "kernel_size": 3, "filters": 4, "num_layers": 2,
        "hidden_size": 16, "micro_batch_size": 64, "accumulation_steps": 1, "patience": 5}
BOUNDS = ["unit", "rul", "rul_lower", "rul_upper", "padded"]
BANDED = ["unit", "rul", "rul_lower", "rul_upper", "p_fail_within", "padded"]


# ------------------------------------------------------------------ the conformal quantile


def test_half_width_is_the_kth_smallest_score_k_ceil_n_plus_1_times_coverage():
    scores = np.arange(1.0, 20.0)  # n = 19
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(scores) * rng.choice([-1, 1], 19)  # residuals of either sign
    # k = ceil(20 * 0.9) = 18: the 18th smallest; np.quantile(method="higher") at k/n gives 19
    assert fit_conformal(shuffled, 0.9).half_width == 18.0
    assert fit_conformal(shuffled, 0.5).half_width == 10.0  # k = ceil(10) = 10
    assert conformal_quantile(np.arange(1.0, 10.0), 0.9) == 9.0  # n = 9, k = 9: the maximum
    assert conformal_quantile(np.arange(1.0, 101.0), 0.9) == 91.0  # k = ceil(90.9) = 91
    interval = fit_conformal(shuffled, 0.9)
    assert (interval.coverage, interval.n_calibration, interval.method) == (0.9, 19, "absolute")


def test_too_few_residuals_for_the_coverage_is_refused():
    assert min_calibration_size(0.9) == 9 and min_calibration_size(0.95) == 19
    assert min_calibration_size(0.5) == 1
    with pytest.raises(ValueError, match="coverage 0.9 needs at least 9 calibration residuals, "
                                         "got 8"):
        fit_conformal(np.ones(8), 0.9)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        fit_conformal(np.ones(50), 1.0)


@pytest.mark.parametrize(("n", "coverage"), [(19, 0.9), (200, 0.9), (49, 0.8)])
def test_coverage_on_exchangeable_data_is_the_finite_sample_value(n, coverage):
    """Calibrate on n draws, test on fresh draws of the same distribution, 3000 times: the
    mean coverage is k / (n + 1) >= coverage (exactly 0.9 for n = 19; the rank one too far
    would give 0.95), and every single target is met within 5 points on average."""
    rng = np.random.default_rng(1)
    draws, fresh = 3000, 40
    covered = np.empty(draws)
    for i in range(draws):
        residuals = rng.standard_t(4, n + fresh) * 7.0  # heavy tails: no Gaussian shortcut
        interval = fit_conformal(residuals[:n], coverage)
        lower, upper = interval.bounds(np.zeros(fresh), low=-np.inf)
        covered[i] = interval_scores(lower, upper, residuals[n:])["coverage"]
    expected = math.ceil((n + 1) * coverage) / (n + 1)
    assert abs(covered.mean() - expected) < 0.006
    assert abs(covered.mean() - coverage) < 0.05


def test_bounds_are_clipped_to_the_target_range_like_the_prediction():
    interval = Interval(0.9, 10.0, 100)
    lower, upper = interval.bounds([3.0, 60.0, 120.0], high=125)
    np.testing.assert_array_equal(lower, [0.0, 50.0, 110.0])
    np.testing.assert_array_equal(upper, [13.0, 70.0, 125.0])


def test_scaled_score_gives_each_prediction_its_own_width():
    residuals = np.array([1.0, -2.0, 3.0, -4.0, 5.0, 6.0, -7.0, 8.0, 9.0, 10.0])
    spread = np.full(10, 2.0)
    interval = fit_conformal(residuals, 0.9, spread=spread)
    assert interval.method == "scaled" and interval.half_width == 5.0  # 10th of |r| / 2
    lower, upper = interval.bounds([50.0, 50.0], spread=[1.0, 3.0])
    np.testing.assert_array_equal(lower, [45.0, 35.0])
    np.testing.assert_array_equal(upper, [55.0, 65.0])
    with pytest.raises(ValueError, match="needs each prediction's spread"):
        interval.bounds([50.0])
    with pytest.raises(ValueError, match="takes no spread"):
        Interval(0.9, 5.0, 10).bounds([50.0], spread=[1.0])
    with pytest.raises(ValueError, match="spread must be finite and > 0"):
        fit_conformal(residuals, 0.9, spread=np.zeros(10))


# ------------------------------------------------------------------ the calibration split


def test_truncation_points_are_each_windows_cycle_and_its_engines_life(make_frame):
    """Every full window of run-to-failure engines is one truncation point: its last row's
    cycle t and the engine's life L, so that its target is min(L - t, cap)."""
    from rul.preprocessing import Preprocessor

    frame = make_frame((40, 31, 55))
    windows = Preprocessor(window=30).fit(frame).window_set(frame)
    t, life = truncation_points(windows.units, 30)
    assert t.tolist() == [*range(30, 41), *range(30, 32), *range(30, 56)]
    assert life.tolist() == [40] * 11 + [31] * 2 + [55] * 26
    np.testing.assert_array_equal(np.minimum(life - t, 125), windows.targets)
    np.testing.assert_array_equal(np.minimum(life - t, 20),
                                  Preprocessor(window=30, rul_cap=20).fit(frame)
                                  .window_set(frame).targets)


def test_truncation_weights_count_each_engine_once_at_test_like_life_fractions():
    """Each engine weighs 1 / engines whatever its length; the draws fall at life fractions in
    LIFE_FRACTION (at least the window); the same seed draws the same points."""
    lives = {1: 360, 2: 130, 3: 200}
    units = np.concatenate([np.full(life - 30 + 1, u) for u, life in lives.items()])
    weights = truncation_weights(units, 30, seed=7)
    t, life = truncation_points(units, 30)
    for u in lives:
        assert weights[units == u].sum() == pytest.approx(1 / 3)
    drawn = weights > 0
    low, high = LIFE_FRACTION
    assert (t[drawn] >= np.maximum(np.rint(low * life[drawn]) - 1, 30)).all()
    assert (t[drawn] <= np.rint(high * life[drawn]) + 1).all()
    np.testing.assert_array_equal(weights, truncation_weights(units, 30, seed=7))
    assert not np.array_equal(weights, truncation_weights(units, 30, seed=8))
    # the short engine's early fractions fall before the window: its first window takes them
    short = units == 2
    assert weights[short][0] > 2 * np.median(weights[short][weights[short] > 0])
    # the weighted mean life fraction is the uniform law's mean, 0.585 (the first window's
    # pile-up lifts it a little)
    assert np.sum(weights * t / life) == pytest.approx(sum(LIFE_FRACTION) / 2, abs=0.03)


def test_calibration_weighs_engines_not_windows():
    """A long engine with small errors at its 1000 windows, a short one with large errors at
    its 40. On every window alike the long engine decides the 95 % quantile (the short one is
    4 % of the windows); on test-like weights each engine counts once and the upper bound
    holds the short engine's error. (Every error is positive: the lower bound stays at the
    prediction.)"""
    units = np.r_[np.full(1000, 1), np.full(40, 2)]
    predicted = np.full(len(units), 60.0)
    true = predicted + np.r_[np.full(1000, 1.0), np.full(40, 20.0)]
    band = Interval(0.9, None, 1, "banded", BAND_EDGES).band([60.0])[0]
    test_like = fit_interval(CalibrationSet(predicted, true, units, 30), 0.9, seed=0,
                             rul_cap=125.0)
    every_window = fit_banded(predicted, true, 0.9, BAND_EDGES, Weighting(engines=units))
    assert (test_like.lower[band], test_like.upper[band]) == (0.0, 20.0)
    assert (every_window.lower[band], every_window.upper[band]) == (0.0, 1.0)
    assert test_like.n_calibration == every_window.n_calibration == 2


def test_the_shipped_interval_is_cut_at_the_level_validation_chose():
    """100 engines, engine k erring by k - 50 at each of its windows: with TAIL_SHARE 0.7 a
    90 % interval holds 93 % of the engines' errors, not 90 %: the central one leaves 3.5 %
    above it (the 97th engine's error, 46), the shortest one spans 93 engines."""
    assert TAIL_SHARE == 0.7 and calibration_level(0.9) == pytest.approx(0.93)
    units = np.repeat(np.arange(100), 20)
    predicted = np.full(len(units), 60.0)
    calibration = CalibrationSet(predicted, predicted + units - 50.0, units, 30)
    band = Interval(0.9, None, 1, "banded", BAND_EDGES).band([60.0])[0]
    central = fit_interval(calibration, 0.9, seed=0, rul_cap=125.0,
                           recipe=IntervalRecipe(shortest=False))
    assert (central.lower[band], central.upper[band]) == (-47.0, 46.0)
    plain = fit_interval(calibration, 0.9, seed=0, rul_cap=125.0,
                         recipe=IntervalRecipe(tail_share=1.0, shortest=False))
    assert (plain.lower[band], plain.upper[band]) == (-45.0, 44.0)
    shipped = fit_interval(calibration, 0.9, seed=0, rul_cap=125.0)
    assert shipped.upper[band] - shipped.lower[band] == 92.0  # 93 engines' errors, one apart
    engine_errors = np.arange(100) - 50.0
    held = (engine_errors >= shipped.lower[band]) & (engine_errors <= shipped.upper[band])
    assert held.sum() == 93  # still the level's share of the engines, one fewer than central


def test_the_shortest_span_leaves_out_what_the_cap_would_cut_anyway():
    """Predictions at 120 with errors spread evenly over [-40, 20): above the cap (125) the
    upper bound is clipped, so covering the top errors costs nothing. The central 90 % span
    leaves 5 % out at each end and is 42 cycles wide once clipped; the shortest leaves the
    lowest 10 % out: 39 wide, and it still holds 90 % of the errors."""
    errors = np.arange(-40.0, 20.0, 0.1)  # 600 errors, evenly spread
    predicted = np.full(len(errors), 120.0)
    central = fit_banded(predicted, predicted + errors, 0.9, (), spans=Spans(0.9, high=125.0))
    shortest = fit_banded(predicted, predicted + errors, 0.9, (),
                          spans=Spans(0.9, shortest=True, high=125.0))
    assert central.lower[0] == pytest.approx(-37.0, abs=0.11)
    assert shortest.lower[0] == pytest.approx(-34.0, abs=0.11)
    width = {name: float(np.diff(np.ravel(interval.bounds([120.0], high=125.0)))[0])
             for name, interval in (("central", central), ("shortest", shortest))}
    assert width["central"] == pytest.approx(42.0, abs=0.11)
    assert width["shortest"] == pytest.approx(39.0, abs=0.11)
    held = (errors >= shortest.lower[0]) & (errors <= shortest.upper[0])
    assert held.mean() >= 0.9
    # without the clip the errors are even: every span is as wide, and the central one is kept
    unclipped = fit_banded(predicted, predicted + errors, 0.9, (),
                           spans=Spans(0.9, shortest=True))
    assert (unclipped.lower, unclipped.upper) == (central.lower, central.upper)


def test_the_shortest_span_of_errors_leaning_one_way_is_narrower_and_still_covers():
    """Errors with a long lower tail (the model predicting too much, now and then by far):
    the shortest 90 % span is narrower than the central one and covers 90 % of fresh errors
    drawn alike."""
    rng = np.random.default_rng(3)

    def draw(n):
        return 3.0 - rng.gamma(1.5, 6.0, n)

    errors = draw(20000)
    predicted = np.full(len(errors), 60.0)
    central = fit_banded(predicted, predicted + errors, 0.9, ())
    shortest = fit_banded(predicted, predicted + errors, 0.9, (), spans=Spans(shortest=True))
    assert (shortest.upper[0] - shortest.lower[0]
            < 0.93 * (central.upper[0] - central.lower[0]))
    fresh = draw(20000)
    assert np.mean((fresh >= shortest.lower[0]) & (fresh <= shortest.upper[0])) == \
        pytest.approx(0.9, abs=0.01)
    assert shortest.errors == central.errors  # the predictive distribution does not move


# ------------------------------------------------------------------ bands and p_fail


def test_weighted_quantile_is_the_smallest_value_whose_weight_share_reaches_the_level():
    values, weights = np.array([3.0, 1.0, 2.0, 4.0]), np.array([0.1, 0.4, 0.2, 0.3])
    assert weighted_quantile(values, weights, 0.4) == 1.0
    assert weighted_quantile(values, weights, 0.41) == 2.0
    assert weighted_quantile(values, weights, 0.7) == 3.0
    assert weighted_quantile(values, weights, 0.71) == 4.0
    assert weighted_quantile(values, np.ones(4), 0.5) == 2.0
    assert weighted_quantile(values, weights, 1.01) == math.inf


@pytest.mark.parametrize(("predicted", "band"), [(0.0, 0), (25.0, 0), (25.001, 1), (50.0, 1),
                                                 (75.0, 2), (99.9, 3), (100.0, 3),
                                                 (100.5, 4), (125.0, 4)])
def test_a_prediction_falls_in_the_band_whose_upper_edge_it_does_not_pass(predicted, band):
    interval = Interval(0.9, None, 1, "banded", BAND_EDGES)
    assert interval.band([predicted]).tolist() == [band]


def test_each_band_has_its_own_bounds_from_its_own_errors():
    """Errors grow with the predicted RUL: each band's offsets are its own errors' 5 % and 95 %
    quantiles (equal-tailed, so a band whose errors lean one way gets an asymmetric interval);
    a band nothing falls in takes the distribution of all points."""
    rng = np.random.default_rng(0)
    predicted = rng.uniform(0, 90, 20000)  # nothing above 100: band 4 is empty
    scale = np.where(predicted <= 25, 2.0, 10.0)
    error = rng.normal(0, 1, len(predicted)) * scale + np.where(predicted > 75, -5.0, 0.0)
    interval = fit_banded(predicted, predicted + error, 0.9, BAND_EDGES)
    assert interval.method == "banded" and interval.n_calibration == 20000
    z = 1.6449
    assert interval.lower[0] == pytest.approx(-2 * z, rel=0.05)
    assert interval.upper[0] == pytest.approx(2 * z, rel=0.05)
    assert interval.upper[1] == pytest.approx(10 * z, rel=0.05)
    assert interval.lower[3] == pytest.approx(-5 - 10 * z, rel=0.05)
    assert interval.upper[3] == pytest.approx(-5 + 10 * z, rel=0.1)
    everything = fit_banded(predicted, predicted + error, 0.9, ())
    assert (interval.lower[4], interval.upper[4]) == (everything.lower[0], everything.upper[0])
    lower, upper = interval.bounds([10.0, 80.0, 124.0], high=125)
    np.testing.assert_allclose(lower, [max(10 + interval.lower[0], 0), 80 + interval.lower[3],
                                       124 + interval.lower[4]])
    np.testing.assert_allclose(upper, [10 + interval.upper[0], 80 + interval.upper[3], 125.0])
    with pytest.raises(ValueError, match="takes no spread"):
        interval.bounds([10.0], spread=[1.0])
    with pytest.raises(ValueError, match="band edges must increase"):
        fit_banded(predicted, predicted + error, 0.9, (50.0, 25.0))


def test_the_bounds_hold_the_prediction_where_a_bands_errors_lean_one_way():
    """A band whose errors are all positive (the model predicts too little there) still gets a
    lower bound at the prediction, not above it: a planner reads rul between its bounds."""
    predicted = np.concatenate([np.full(100, 10.0), np.full(100, 60.0)])
    errors = np.concatenate([np.linspace(2.0, 6.0, 100), np.linspace(-8.0, 8.0, 100)])
    interval = fit_banded(predicted, predicted + errors, 0.9, BAND_EDGES)
    assert interval.lower[0] == 0.0 and interval.upper[0] > 5.0
    assert interval.lower[1] < 0.0 < interval.upper[1]
    lower, upper = interval.bounds([10.0, 60.0])
    assert (lower <= [10.0, 60.0]).all() and (upper >= [10.0, 60.0]).all()


def test_a_wider_level_cuts_the_bounds_further_out_and_stretches_the_distribution_alike():
    """coverage 0.9 cut at level 0.92: the bounds are the errors' 4 % and 96 % quantiles, and
    the stored distribution puts 5 % below the lower bound and 5 % above the upper one, so
    that p_fail read at a bound is the promised tail."""
    errors = np.arange(-500.0, 500.0)  # 1000 errors, one per cycle: quantiles read exactly
    predicted = np.full(1000, 60.0)
    interval = fit_banded(predicted, predicted + errors, 0.9, (), spans=Spans(0.92))
    assert (interval.lower[0], interval.upper[0]) == (-460.0, 459.0)
    plain = fit_banded(predicted, predicted + errors, 0.9, ())
    assert (plain.lower[0], plain.upper[0]) == (-450.0, 449.0)
    assert interval.errors[0][5] == pytest.approx(-460.0, abs=1)  # its 5 % quantile
    assert interval.errors[0][95] == pytest.approx(459.0, abs=1)
    assert interval.failure_probability([1000.0], 1000 - 460.0)[0] == pytest.approx(0.05,
                                                                                     abs=0.002)
    with pytest.raises(ValueError, match="level between it and 1"):
        fit_banded(predicted, predicted + errors, 0.9, (), spans=Spans(0.8))


def test_failure_probability_reads_the_bands_predictive_distribution():
    """Errors N(0, 8) in one band: P(true <= h) = Phi((h - pred) / 8)."""
    from statistics import NormalDist

    rng = np.random.default_rng(1)
    predicted = rng.uniform(0, 125, 50000)
    interval = fit_banded(predicted, predicted + rng.normal(0, 8, len(predicted)), 0.9, ())
    for pred, horizon in ((20.0, 20.0), (10.0, 20.0), (30.0, 20.0), (35.0, 10.0)):
        expected = NormalDist(0, 8).cdf(horizon - pred)
        assert interval.failure_probability([pred], horizon)[0] == pytest.approx(
            expected, abs=0.01)
    assert interval.failure_probability([120.0], 20)[0] == 0.0  # beyond the largest error
    assert interval.failure_probability([0.0], 60)[0] == 1.0
    assert len(interval.errors[0]) == len(ERROR_LEVELS)
    with pytest.raises(ValueError, match="stores no predictive distribution"):
        Interval(0.9, 10.0, 50).failure_probability([20.0], 20)


def test_failure_probability_is_calibrated_on_exchangeable_engines():
    """Engines whose error spread and bias depend on the band of the prediction (what the
    bands assume), calibrated on 300 engines and checked on 1000 fresh ones: in every bucket of
    the predicted probability the share that failed within the horizon is the mean predicted
    probability (within 0.03), and the interval covers 90 % of the fresh ones in every band."""
    rng = np.random.default_rng(2)
    spread, bias = np.array([2.0, 6.0, 10.0, 12.0, 8.0]), np.array([1.0, 0, 0, -3.0, 6.0])
    bands = Interval(0.9, None, 1, "banded", BAND_EDGES)

    def engines(n):
        predicted = rng.uniform(0, 125, (n, 30))
        band = bands.band(predicted)
        true = predicted + bias[band] + rng.standard_t(5, (n, 30)) * spread[band]
        return predicted.ravel(), true.ravel(), np.repeat(np.arange(n), 30)

    predicted, true, units = engines(300)
    interval = fit_banded(predicted, true, 0.9, BAND_EDGES, Weighting(engines=units))
    assert interval.n_calibration == 300
    fresh_predicted, fresh_true, _ = engines(1000)
    p_fail = interval.failure_probability(fresh_predicted, 20.0)
    failed = fresh_true <= 20.0
    checked = 0
    for low, high in ((0, 0.05), (0.05, 0.2), (0.2, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01)):
        inside = (p_fail >= low) & (p_fail < high)
        if inside.sum() >= 500:
            assert failed[inside].mean() == pytest.approx(p_fail[inside].mean(), abs=0.03)
            checked += 1
    assert checked >= 4
    lower, upper = interval.bounds(fresh_predicted, low=-np.inf)
    covered = (lower <= fresh_true) & (fresh_true <= upper)
    for band in range(len(BAND_EDGES) + 1):
        inside = interval.band(fresh_predicted) == band
        assert covered[inside].mean() == pytest.approx(0.9, abs=0.02)


# ------------------------------------------------------------------ the config key


@pytest.mark.parametrize("value", ["1.5", "0", "lots", "1", "-0.1", "true"])
def test_interval_coverage_outside_zero_one_is_a_one_line_config_error(value):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(None, [f"interval_coverage={value}"])
    assert str(info.value).startswith("command line: interval_coverage=")
    assert str(info.value).endswith("must be a number strictly between 0 and 1, or null to "
                                    "disable prediction intervals")
    assert "\n" not in str(info.value)


def test_interval_coverage_default_null_and_yaml(tmp_path):
    assert cfg.load().interval_coverage == 0.9
    assert cfg.load(None, ["interval_coverage=null"]).interval_coverage is None
    path = tmp_path / "c.yaml"
    path.write_text("interval_coverage: 0.8\n")
    assert cfg.load(path).interval_coverage == 0.8
    path.write_text("interval_coverage: 1.5\n")
    with pytest.raises(cfg.ConfigError, match=f"^{path}: interval_coverage=1.5: must be"):
        cfg.load(path)


def test_cli_refuses_bad_interval_coverage_with_exit_code_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["train", "interval_coverage=lots"])
    assert result.exit_code == 2, result.output
    assert "interval_coverage='lots': must be a number strictly between 0 and 1" in result.output
    assert "Traceback" not in result.output and list(tmp_path.iterdir()) == []


def test_interval_coverage_is_not_part_of_the_run_identity():
    from rul.tracking.run_names import config_digest

    assert config_digest(cfg.load()) == config_digest(cfg.load(None, ["interval_coverage=0.5"]))


# ------------------------------------------------------------------ the stored spec

SPEC = {"model": "cnn", "window": 30, "rul_cap": 125, "n_features": 14,
        "architecture": {"filters": 4}, "format_version": 1}


def test_spec_stores_the_interval_and_reads_it_back(tmp_path):
    interval = Interval(0.9, 17.5, 3412)
    spec = InferenceSpec.from_dict({**SPEC, "interval": interval.to_dict()})
    spec.write(tmp_path / "spec.json")
    stored = json.loads((tmp_path / "spec.json").read_text())
    assert stored["interval"] == {"coverage": 0.9, "half_width": 17.5, "n_calibration": 3412,
                                  "method": "absolute"}
    assert stored["format_version"] == 1  # old rul versions ignore the new key
    assert InferenceSpec.read(tmp_path / "spec.json").interval == interval
    InferenceSpec.from_dict(SPEC).write(tmp_path / "plain.json")  # no interval: the old keys
    assert json.loads((tmp_path / "plain.json").read_text()) == {**SPEC, "rul_cap": 125.0}


def test_old_format_spec_without_interval_loads_and_predicts_no_bounds(fd001):
    """Models logged before intervals existed: the spec loads, the output has no bounds."""
    from rul.preprocessing import Preprocessor

    spec = InferenceSpec.from_dict(SPEC)  # the keys a spec had before intervals
    assert spec.interval is None
    preprocessor = Preprocessor(window=30, smoothing_alpha=0.1).fit(fd001.train)
    network = InferenceSpec.from_dict({**SPEC, "n_features": preprocessor.n_features,
                                       "architecture": {}}).build_network().eval()
    rows = fd001.test[fd001.test["unit"] <= 3]
    plain = predict_frame(preprocessor, network, rows)
    assert list(plain.columns) == ["unit", "rul", "padded"]
    with_bounds = predict_frame(preprocessor, network, rows, interval=Interval(0.9, 20.0, 50))
    assert list(with_bounds.columns) == BOUNDS
    np.testing.assert_array_equal(with_bounds["rul"], plain["rul"])
    np.testing.assert_allclose(with_bounds["rul_upper"],
                               np.minimum(plain["rul"] + 20.0, 125.0))


def banded_interval() -> Interval:
    rng = np.random.default_rng(3)
    predicted = rng.uniform(0, 125, 2000)
    return fit_banded(predicted, predicted + rng.normal(0, 5, 2000), 0.9, BAND_EDGES,
                      Weighting(engines=np.repeat(np.arange(20), 100)))


def test_spec_stores_a_banded_interval_as_plain_numbers_and_reads_it_back(tmp_path):
    """Bands, bounds and the predictive distribution as JSON numbers, read back by numpy
    alone; the track too."""
    interval = banded_interval()
    spec = InferenceSpec.from_dict({**SPEC, "interval": interval.to_dict(),
                                    "track": "sensors+age"})
    spec.write(tmp_path / "spec.json")
    stored = json.loads((tmp_path / "spec.json").read_text())
    assert stored["track"] == "sensors+age"
    assert set(stored["interval"]) == {"coverage", "n_calibration", "method", "band_edges",
                                       "lower", "upper", "errors"}
    assert stored["interval"]["band_edges"] == [25.0, 50.0, 75.0, 100.0]
    assert len(stored["interval"]["errors"]) == 5
    assert all(len(band) == 101 for band in stored["interval"]["errors"])
    read = InferenceSpec.read(tmp_path / "spec.json").interval
    assert read == interval
    predicted = np.array([5.0, 30.0, 60.0, 90.0, 120.0])
    for a, b in zip(read.bounds(predicted, high=125), interval.bounds(predicted, high=125)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(read.failure_probability(predicted, 20),
                                  interval.failure_probability(predicted, 20))


@pytest.mark.parametrize(("change", "problem"), [
    ({"lower": [1.0]}, "5 band(s) need 5 lower, upper and errors entries of 101 quantiles"),
    ({"errors": [[0.0] * 100] * 5}, "entries of 101 quantiles each"),
    ({"band_edges": [50.0, 25.0, 75.0, 100.0]}, "out of order"),
    ({"upper": [-99.0] * 5}, "out of order"),
    ({"lower": ["x"] * 5}, "must be lists of numbers"),
    ({"band_edges": None}, "must be lists of numbers"),
    ({"coverage": 1.5}, "coverage 1.5 out of range"),
])
def test_a_damaged_banded_interval_is_named(change, problem):
    values = {**banded_interval().to_dict(), **change}
    with pytest.raises(ValueError) as info:
        InferenceSpec.from_dict({**SPEC, "interval": values})
    assert problem in str(info.value) and str(info.value).startswith("inference spec: ")
    missing = {k: v for k, v in banded_interval().to_dict().items() if k != "errors"}
    with pytest.raises(ValueError, match=r"interval lacks \['errors'\]"):
        InferenceSpec.from_dict({**SPEC, "interval": missing})


@pytest.mark.parametrize(("interval", "problem"), [
    ({"coverage": 0.9}, "inference spec: interval lacks ['half_width', 'n_calibration']"),
    ({"coverage": 1.2, "half_width": 3, "n_calibration": 9}, "coverage 1.2 or half_width 3.0"),
    ({"coverage": 0.9, "half_width": 3, "n_calibration": 9, "method": "quantile"},
     "unknown method 'quantile'"),
    ([1, 2], "interval must be a mapping"),
])
def test_a_damaged_stored_interval_is_named(interval, problem):
    with pytest.raises(ValueError) as info:
        InferenceSpec.from_dict({**SPEC, "interval": interval})
    assert problem in str(info.value)


def test_figure_draws_each_test_units_interval():
    predictions = pd.DataFrame({"true_rul_capped": [10.0, 50.0, 100.0],
                                "predicted_rul": [12.0, 80.0, 95.0],
                                "predicted_rul_lower": [2.0, 70.0, 85.0],
                                "predicted_rul_upper": [22.0, 90.0, 105.0]})
    ax = figures.predicted_vs_true(predictions).axes[0]
    assert ax.get_title() == "test units: 67% inside the interval"
    assert [c.get_label() for c in ax.containers] == ["interval covers", "interval misses"]
    plain = figures.predicted_vs_true(predictions.iloc[:, :2]).axes[0]
    assert plain.get_title() == "test units" and not plain.containers


# ------------------------------------------------------------------ a trained model


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory, mlflow_store_at):
    """One tiny tracked training on synthetic C-MAPSS files (10 units of 60 cycles)."""
    from conftest import frame_to_text, synthetic_frame

    root = tmp_path_factory.mktemp("intervals")
    data = root / "cmapss"
    data.mkdir()
    (data / "train_FD001.txt").write_text(frame_to_text(synthetic_frame((60,) * 10)))
    test = synthetic_frame((31, 45, 22, 38, 8), seed=1)
    (data / "test_FD001.txt").write_text(frame_to_text(test))
    (data / "RUL_FD001.txt").write_text("".join(f"{v}\n" for v in (10, 17, 24, 31, 90)))
    with mlflow_store_at(root) as store:
        config = cfg.load(CONFIG_PATH, {**TINY, "data_dir": str(data), "tracking_uri": store.uri,
                                        "checkpoint_dir": str(root / "ckpt")})
        outcome, run_id = train_tracked(config, progress=False)
        yield store, config, outcome, run_id, data, test


def test_interval_is_calibrated_on_the_validation_windows_with_test_like_weights(synthetic_run):
    """Training calibrates the banded interval on every validation window, weighted by the
    test-like draws of the run's split seed: the same interval fit_interval gives."""
    _, config, outcome, _, _, _ = synthetic_run
    from rul.training.batching import WindowBatches
    from rul.training.predict import predict_windows

    val = outcome.data.val
    assert val.targets.max() == 60 - 10 and val.targets.min() == 0  # every truncation point
    device = next(outcome.model.parameters()).device  # where it trained (CUDA on a GPU)
    predicted = predict_windows(outcome.model, WindowBatches(val, device))
    expected = fit_interval(CalibrationSet.of(predicted, val), 0.9, outcome.plan.seeds.split,
                            config.rul_cap)
    assert outcome.interval == expected
    assert outcome.interval.method == "banded" and outcome.interval.n_calibration == 2


def test_run_logs_interval_metrics_and_test_coverage(synthetic_run):
    store, _, outcome, run_id, _, _ = synthetic_run
    metrics = MlflowClient(store.uri).get_run(run_id).data.metrics
    p = outcome.predictions
    inside = (p.predicted_rul_lower <= p.true_rul_capped) & (p.true_rul_capped
                                                             <= p.predicted_rul_upper)
    assert metrics[logged("interval_coverage_target")] == 0.9
    assert metrics[logged("interval_engines")] == 2
    assert metrics[logged("test_interval_coverage")] == pytest.approx(inside.mean())
    assert metrics[logged("test_interval_width")] == pytest.approx(
        (p.predicted_rul_upper - p.predicted_rul_lower).mean())
    assert (p.predicted_rul_lower >= 0).all() and (p.predicted_rul_upper <= 125).all()
    # per true-RUL band: 10, 17, 24 <= 25; 31 in 26-75; 90 > 75
    low = p.true_rul_capped <= 25
    assert metrics[logged("test_interval_coverage_rul_le25")] == pytest.approx(inside[low].mean())
    assert metrics[logged("test_interval_width_rul_gt75")] == pytest.approx(
        (p.predicted_rul_upper - p.predicted_rul_lower)[p.true_rul_capped > 75].mean())
    failed = p.true_rul <= 20
    assert metrics[logged("test_p_fail_brier")] == pytest.approx(
        np.mean((p.p_fail_within - failed) ** 2))
    tags = MlflowClient(store.uri).get_run(run_id).data.tags
    assert tags["rul.track"] == "sensors+age"  # experiments/fd001_age.yaml reads the age


def test_model_loaded_by_uri_returns_bounds_and_failure_probability(synthetic_run, tmp_path):
    store, _, outcome, run_id, data, _ = synthetic_run
    model = mlflow.pyfunc.load_model(outcome.model_uri)
    result = model.predict(read_input(data / "test_FD001.txt"))  # as written: rounded values
    assert list(result.columns) == [*BANDED, "flagged", "flag_reason"]
    outputs = model.metadata.get_output_schema().input_names()
    assert "rul_lower" in outputs and "p_fail_within" in outputs
    spec = json.loads(Path(mlflow.artifacts.download_artifacts(
        f"runs:/{run_id}/model/artifacts/inference/inference_spec.json",
        dst_path=str(tmp_path))).read_text())
    assert spec["track"] == "sensors+age"
    interval = Interval.from_dict(spec["interval"])
    assert interval == outcome.interval
    assert (result.rul_lower <= result.rul).all() and (result.rul <= result.rul_upper).all()
    lower, upper = interval.bounds(result.rul.to_numpy(), high=125)
    np.testing.assert_allclose(result.rul_lower, lower, atol=1e-9)
    np.testing.assert_allclose(result.rul_upper, upper, atol=1e-9)
    np.testing.assert_allclose(result.p_fail_within,
                               interval.failure_probability(result.rul.to_numpy(), 20.0))
    # ONNX (served) against torch (training): within 1e-3 cycles
    np.testing.assert_allclose(result.rul, outcome.predictions.predicted_rul, atol=1e-3)
    # another horizon: a later failure is at least as likely
    later = model.predict(read_input(data / "test_FD001.txt"), params={"horizon": 40})
    assert (later.p_fail_within >= result.p_fail_within).all()
    assert (later.p_fail_within > result.p_fail_within).any()
    np.testing.assert_allclose(later.p_fail_within,
                               interval.failure_probability(later.rul.to_numpy(), 40.0))

    printed = CliRunner().invoke(main, ["predict", "--model", outcome.model_uri, "--input",
                                        str(data / "test_FD001.txt"), "--tracking-uri",
                                        store.uri, "--horizon", "40"])
    assert printed.exit_code == 0, printed.output
    from io import StringIO

    printed = pd.read_csv(StringIO(printed.stdout), keep_default_na=False)  # '' reasons
    pd.testing.assert_frame_equal(printed, later, check_exact=False, atol=1e-4)


@pytest.mark.parametrize("horizon", ["0", "125", "-3", "200"])
def test_a_horizon_outside_the_models_range_is_one_line_exit_2(synthetic_run, horizon):
    store, _, outcome, _, data, _ = synthetic_run
    printed = CliRunner().invoke(main, ["predict", "--model", outcome.model_uri, "--input",
                                        str(data / "test_FD001.txt"), "--tracking-uri",
                                        store.uri, "--horizon", horizon])
    assert printed.exit_code == 2, printed.output
    assert ("horizon must be a number of cycles between 0 and the model's RUL cap (125), "
            "exclusive") in printed.output
    assert "Traceback" not in printed.output
    model = mlflow.pyfunc.load_model(outcome.model_uri)
    with pytest.raises(mlflow.exceptions.MlflowException, match="horizon must be a number"):
        model.predict(read_input(data / "test_FD001.txt"), params={"horizon": float(horizon)})


def test_interval_coverage_null_logs_a_model_without_bounds(synthetic_run):
    store, config, _, _, _, test = synthetic_run
    outcome, run_id = train_tracked(config.replace(interval_coverage=None, epochs=1,
                                                   register=False), progress=False)
    assert outcome.interval is None
    assert "predicted_rul_lower" not in outcome.predictions
    metrics = MlflowClient(store.uri).get_run(run_id).data.metrics
    assert not {k for k in metrics if "interval" in k}
    model = mlflow.pyfunc.load_model(outcome.model_uri)
    assert list(model.predict(test).columns) == ["unit", "rul", "padded", "flagged",
                                                 "flag_reason"]
    assert "rul_lower" not in model.metadata.get_output_schema().input_names()


def test_coverage_the_validation_windows_cannot_promise_is_refused_before_any_run(
        synthetic_run):
    from rul.plan import plan_run

    _, config, _, _, _, _ = synthetic_run
    with pytest.raises(cfg.ConfigError) as info:
        plan_run(config.replace(interval_coverage=0.999))
    assert str(info.value) == ("interval_coverage=0.999: needs at least 999 validation windows "
                               "to calibrate, the validation units give 102 (lower it, or "
                               "raise val_fraction)")


# ------------------------------------------------------------------ FD001 (slow)


@pytest.mark.slow
def test_fd001_test_coverage_is_near_the_target(real_data_dir):
    """A short real training (5 epochs of the default CNN): the 100 test units' coverage of
    the 90% interval, calibrated on the validation units only, is within 5 points of 90%; the
    interval is narrower near the end of life than in mid-life; and p_fail_within(20) beats
    the base rate (its Brier score under the one of always predicting the share that fails)."""
    from rul.plan import plan_run
    from rul.training.run import train

    config = cfg.load(CONFIG_PATH, {"epochs": 5, "data_dir": str(real_data_dir)})
    outcome = train(plan_run(config), progress=False)
    m = outcome.metrics
    failed = (outcome.predictions["true_rul"] <= 20).to_numpy()
    base = float(np.mean((failed.mean() - failed) ** 2))
    print(f"FD001 5 epochs: interval on {outcome.interval.n_calibration} validation engines, "
          f"test coverage {m['test_interval_coverage']:.2f} (by true RUL "
          f"{m['test_interval_coverage_rul_le25']:.2f} / "
          f"{m['test_interval_coverage_rul_26_75']:.2f} / "
          f"{m['test_interval_coverage_rul_gt75']:.2f}), mean width "
          f"{m['test_interval_width']:.1f} ({m['test_interval_width_rul_le25']:.1f} / "
          f"{m['test_interval_width_rul_26_75']:.1f} / {m['test_interval_width_rul_gt75']:.1f}); "
          f"p_fail Brier {m['test_p_fail_brier']:.3f}, base rate {base:.3f}")
    assert abs(m["test_interval_coverage"] - 0.9) <= 0.05
    assert m["test_interval_width_rul_le25"] < m["test_interval_width_rul_26_75"]
    assert m["test_p_fail_brier"] < base


def test_a_value_beyond_the_fleet_widens_the_interval_and_unknowns_p_fail(synthetic_run):
    """An out-of-fleet value must not buy a narrower interval or a confident p_fail: the
    engine gets [0, rul_cap] and p_fail_within NaN, with its flag; the others are unchanged."""
    store, _, outcome, _, data, _ = synthetic_run
    model = mlflow.pyfunc.load_model(outcome.model_uri)
    rows = read_input(data / "test_FD001.txt")
    clean = model.predict(rows)
    glitched = rows.copy()
    glitched.loc[glitched.index[glitched["unit"] == 2][-1], "s_9"] = 1e9
    result = model.predict(glitched)
    two = result[result.unit == 2].iloc[0]
    assert two.flagged and "s_9" in two.flag_reason
    assert (two.rul_lower, two.rul_upper) == (0.0, 125.0) and np.isnan(two.p_fail_within)
    before = clean[clean.unit == 2].iloc[0]
    assert two.rul_upper - two.rul_lower >= before.rul_upper - before.rul_lower
    others = result.unit != 2
    pd.testing.assert_frame_equal(result[others], clean[others])

"""Prediction intervals: the conformal math, the config key, the stored spec, a trained model's
bounds through MLflow (pyfunc by URI, `rul predict`), and FD001's test coverage (slow)."""

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
from rul.evaluation import figures
from rul.evaluation.conformal import (
    Interval,
    conformal_quantile,
    fit_conformal,
    interval_scores,
    min_calibration_size,
)
from rul.inference import read_rows
from rul.serving.predictor import InferenceSpec, predict_frame
from rul.tracking.tracked_run import train_tracked

ROOT = Path(__file__).resolve().parents[1]
CONFIG_PATH = ROOT / "experiments" / "fd001.yaml"
TINY = {"epochs": 2, "window": 10, "kernel_size": 3, "filters": 4, "num_layers": 2,
        "hidden_size": 16, "micro_batch_size": 64, "accumulation_steps": 1, "patience": 5}
BOUNDS = ["unit", "rul", "rul_lower", "rul_upper", "padded"]


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
    from rul.tracking.tracked_run import config_digest

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


def test_interval_is_the_conformal_quantile_of_the_validation_residuals(synthetic_run):
    _, config, outcome, _, _, _ = synthetic_run
    from rul.training.batching import WindowBatches
    from rul.training.predict import predict_windows

    val = outcome.data.val
    assert outcome.interval.n_calibration == len(val) == 2 * (60 - 10 + 1)  # all windows
    predicted = predict_windows(outcome.model, WindowBatches(val, "cpu"))
    scores = np.abs(predicted.astype(np.float64) - val.targets)
    q, k = outcome.interval.half_width, math.ceil((len(val) + 1) * 0.9)
    assert (scores <= q).sum() >= k > (scores < q).sum()  # q is the k-th smallest
    assert val.targets.max() == 60 - 10 and val.targets.min() == 0  # every truncation point


def test_run_logs_interval_metrics_and_test_coverage(synthetic_run):
    store, _, outcome, run_id, _, _ = synthetic_run
    metrics = MlflowClient(store.uri).get_run(run_id).data.metrics
    p = outcome.predictions
    inside = (p.predicted_rul_lower <= p.true_rul_capped) & (p.true_rul_capped
                                                             <= p.predicted_rul_upper)
    assert metrics["interval_coverage_target"] == 0.9
    assert metrics["interval_half_width"] == pytest.approx(outcome.interval.half_width)
    assert metrics["test_interval_coverage"] == pytest.approx(inside.mean())
    assert metrics["test_interval_width"] == pytest.approx(
        (p.predicted_rul_upper - p.predicted_rul_lower).mean())
    assert (p.predicted_rul_lower >= 0).all() and (p.predicted_rul_upper <= 125).all()


def test_model_loaded_by_uri_returns_bounds_with_the_stored_half_width(synthetic_run, tmp_path):
    store, _, outcome, run_id, data, _ = synthetic_run
    model = mlflow.pyfunc.load_model(outcome.model_uri)
    result = model.predict(read_rows(data / "test_FD001.txt"))  # as written: rounded values
    assert list(result.columns) == [*BOUNDS, "flagged", "flag_reason"]
    assert "rul_lower" in model.metadata.get_output_schema().input_names()
    spec = json.loads(Path(mlflow.artifacts.download_artifacts(
        f"runs:/{run_id}/model/artifacts/inference/inference_spec.json",
        dst_path=str(tmp_path))).read_text())
    q = spec["interval"]["half_width"]
    assert q == pytest.approx(outcome.interval.half_width) and q > 0
    assert spec["interval"]["n_calibration"] == outcome.interval.n_calibration
    assert (result.rul_lower <= result.rul).all() and (result.rul <= result.rul_upper).all()
    np.testing.assert_allclose(result.rul_upper, np.minimum(result.rul + q, 125), atol=1e-9)
    np.testing.assert_allclose(result.rul_lower, np.maximum(result.rul - q, 0), atol=1e-9)
    # ONNX (served) against torch (training): within 1e-3 cycles
    np.testing.assert_allclose(result.rul, outcome.predictions.predicted_rul, atol=1e-3)

    printed = CliRunner().invoke(main, ["predict", "--model", outcome.model_uri, "--input",
                                        str(data / "test_FD001.txt"), "--tracking-uri",
                                        store.uri])
    assert printed.exit_code == 0, printed.output
    from io import StringIO

    printed = pd.read_csv(StringIO(printed.stdout), keep_default_na=False)  # '' reasons
    pd.testing.assert_frame_equal(printed, result, check_exact=False, atol=1e-4)


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
    the 90% interval, calibrated on the validation units only, is within 5 points of 90%."""
    from rul.plan import plan_run
    from rul.training.run import train

    config = cfg.load(CONFIG_PATH, {"epochs": 5, "data_dir": str(real_data_dir)})
    outcome = train(plan_run(config), progress=False)
    m = outcome.metrics
    print(f"FD001 5 epochs: half-width {m['interval_half_width']:.1f} cycles on "
          f"{outcome.interval.n_calibration} validation windows, test coverage "
          f"{m['test_interval_coverage']:.2f}, mean width {m['test_interval_width']:.1f}")
    assert abs(m["test_interval_coverage"] - 0.9) <= 0.05
    assert 0 < m["interval_half_width"] < 60

"""tools/: the truncation score that compares models with different windows fairly."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import load_tool

from rul.data.split import rows_of
from rul.evaluation.metrics import rmse
from rul.models import build_network
from rul.preprocessing import Preprocessor
from rul.training.batching import WindowBatches
from rul.training.predict import predict_windows

ARCH = {"filters": 4, "kernel_size": 10, "num_layers": 2, "hidden_size": 16, "dropout": 0.5}


@pytest.fixture(scope="module")
def tool():
    return load_tool("truncation_val")


def tiny_model(fd001, window):
    """An untrained, seeded network with its fitted preprocessing (the pyfunc's inner model)."""
    preprocessor = Preprocessor(window=window, smoothing_alpha=0.1,
                                include_cycle=True).fit(fd001.train)
    torch.manual_seed(0)
    network = build_network("cnn", preprocessor.n_features, window, 125, **ARCH).eval()
    return SimpleNamespace(preprocessor=preprocessor, model=network)


def test_from_the_window_on_it_is_the_val_rmse_of_every_full_window(tool, fd001):
    rows = rows_of(fd001.train, np.array([3, 17, 58]))
    inner = tiny_model(fd001, 30)
    windows = inner.preprocessor.window_set(rows)
    expected = rmse(predict_windows(inner.model, WindowBatches(windows, torch.device("cpu"))),
                    windows.targets)
    score, n = tool.truncation_rmse(inner, rows, first_cycle=30)
    assert n == len(windows) == sum(len(g) - 29 for _, g in rows.groupby("unit"))
    assert score == pytest.approx(expected, rel=1e-5)


def test_a_longer_window_is_scored_on_the_same_truncations_edge_padded(tool, fd001):
    rows = rows_of(fd001.train, np.array([3, 17, 58]))
    inner = tiny_model(fd001, 40)
    score, n = tool.truncation_rmse(inner, rows, first_cycle=30)
    assert n == sum(len(g) - 29 for _, g in rows.groupby("unit"))  # the window-30 count
    # cycles 30-39 are predicted from padded histories, the rest from full windows
    full, n_full = tool.truncation_rmse(inner, rows, first_cycle=40)
    assert n_full == n - 3 * 10 and full != score


def test_the_test_like_score_weighs_each_engine_once_as_training_validation_does(tool, fd001):
    """From the window on, the test-like score is the weighted RMSE of every full window with
    the weights training's test-like validation (val_weights: truncation) gives them."""
    from rul.evaluation.truncation import truncation_weights

    rows = rows_of(fd001.train, np.array([3, 17, 58]))
    inner = tiny_model(fd001, 30)
    windows = inner.preprocessor.window_set(rows)
    predicted = predict_windows(inner.model, WindowBatches(windows, torch.device("cpu")))
    errors, units = tool.truncation_errors(inner, rows, first_cycle=30)
    np.testing.assert_array_equal(units, windows.units)
    expected = rmse(predicted, windows.targets, truncation_weights(windows.units, 30, 7))
    assert tool.test_like_rmse(errors, units, 30, seed=7) == pytest.approx(expected, rel=1e-5)
    assert expected != pytest.approx(rmse(predicted, windows.targets), rel=1e-3)


def test_a_lean_model_scores_as_its_torch_network(tool, fd001, tmp_path):
    """Models logged now run ONNX: the same score as the torch network within float noise."""
    from rul.models.spec import NetworkSpec
    from rul.serving.onnx_export import save_runtime
    from rul.serving.runtime import LeanModel

    rows = rows_of(fd001.train, np.array([3, 17]))
    inner = tiny_model(fd001, 30)
    spec = NetworkSpec("cnn", inner.preprocessor.n_features, 30, 125, ARCH)
    save_runtime(tmp_path, spec, [inner.model], inner.preprocessor)
    lean = SimpleNamespace(model=LeanModel.load(tmp_path))  # the lean pyfunc's inner model
    assert tool.truncation_rmse(lean, rows, 30) == pytest.approx(
        tool.truncation_rmse(inner, rows, 30), rel=1e-5)


# ------------------------------------------------------------------ tools/interval_report.py



@pytest.fixture(scope="module")
def report_tool():
    return load_tool("interval_report")


def scored_model(errors_per_engine, lives=None):
    """What `scored` gives for a model whose error on engine i is errors_per_engine[i] at
    every truncation point; predictions = targets + error."""
    from rul.evaluation.intervals import CalibrationSet

    lives = lives or [100] * len(errors_per_engine)
    units = np.concatenate([np.full(life - 29, i + 1) for i, life in enumerate(lives)])
    targets = np.concatenate([np.minimum(np.arange(life - 30, -1, -1), 125.0) for life in lives])
    errors = np.concatenate([np.full(life - 29, e) for e, life in zip(errors_per_engine, lives)])
    val = CalibrationSet(np.clip(targets - errors, 0, 125), targets, units, 30)
    return {"val": val, "val_spread": np.ones(len(units)), "split_seed": 1, "cap": 125.0}


def test_each_validation_engine_is_scored_by_the_interval_of_the_others(report_tool):
    """20 engines, each with one constant error; the engine with the largest error falls
    outside the interval calibrated on the other 19, whose largest is smaller."""
    errors = np.linspace(-9.5, 9.5, 20)
    model = scored_model(errors)
    points = report_tool.leave_one_engine_out(model, report_tool.shipped, horizon=20)
    assert [p["engine"] for p in points] == list(range(1, 21))
    for p in points:
        assert p["weight"].sum() == pytest.approx(1.0)
    extreme, middle = points[19], points[10]
    assert extreme["covered"][extreme["true"] > 15].mean() == 0.0  # +9.5 is past the others'
    assert middle["covered"][middle["true"] > 15].all()
    summary = report_tool.summarize_points(points)
    assert summary["engine_min"] < 0.5 < summary["engine_median"]
    assert set(summary) >= {"coverage", "width", "coverage_rul_le25", "width_rul_26_75"}
    assert "coverage_rul_gt75" not in summary  # lives of 100: no truncation point above 70


def test_the_validation_brier_counts_each_left_out_engine_once(report_tool):
    """Two engines, each counted once whatever its number of points: one always right (0),
    one with p_fail 0.5 on its 3 points (0.25 each): 0.125, not 0.1875 as points pooled."""
    points = [{"weight": np.array([1.0]), "p_fail": np.array([1.0]), "failed": np.array([True])},
              {"weight": np.full(3, 1 / 3), "p_fail": np.full(3, 0.5),
               "failed": np.array([True, False, False])}]
    assert report_tool.validation_brier(points) == pytest.approx(0.125)
    errors = np.linspace(-9.5, 9.5, 20)  # the scored model's: engines of 100 cycles
    points = report_tool.leave_one_engine_out(scored_model(errors), report_tool.shipped, 20)
    assert 0 < report_tool.validation_brier(points) < 0.1


def test_the_test_like_validation_rmse_counts_each_engine_once(report_tool):
    """Engines of 100 and 300 cycles erring by 1 and 3 everywhere: every window once weighs
    the long engine by its 271 windows against 71, test-like each engine once."""
    from rul.evaluation.intervals import CalibrationSet

    units = np.repeat([1, 2], [71, 271])  # the full windows of 30 of lives 100 and 300
    targets = np.linspace(0.0, 125.0, 342)
    val = CalibrationSet(targets + np.where(units == 1, 1.0, 3.0), targets, units, 30)
    windows, test_like = report_tool.validation_rmse({"val": val, "split_seed": 1})
    assert windows == pytest.approx(np.sqrt((71 * 1 + 271 * 9) / 342))
    assert test_like == pytest.approx(np.sqrt((1 + 9) / 2))


def test_the_width_bound_is_the_narrowest_span_holding_90_percent_of_the_test_units(
        report_tool):
    """100 test units predicted at 60, unit k erring by k - 50 cycles: the narrowest span
    holding 90 of them is 89 cycles wide (any 90 consecutive errors), and it covers 90 %."""
    true = 60.0 + np.arange(100) - 50.0
    model = {"test_predicted": np.full(100, 60.0), "test_capped": true, "cap": 125.0}
    bound = report_tool.fitted_on_test(model)
    assert bound["coverage"] == pytest.approx(0.9)
    assert bound["width"] == pytest.approx(89.0)
    # predicted at 120, true min(70 + k, 125): errors -50..4, then 45 units at +5 (capped).
    # The span holding 90 leaves out the 10 lowest: [80, 125], 45 wide (a central one, 50)
    model = {"test_predicted": np.full(100, 120.0), "test_capped": np.minimum(true + 60, 125),
             "cap": 125.0}
    bound = report_tool.fitted_on_test(model)
    assert bound["coverage"] == pytest.approx(0.9)
    assert bound["width"] == pytest.approx(45.0)


def test_the_reliability_table_buckets_predicted_probabilities(report_tool):
    p_fail = np.array([0.0, 0.01, 0.1, 0.15, 0.3, 0.9, 1.0])
    failed = np.array([False, False, True, False, True, True, True])
    rows = report_tool.reliability(p_fail, failed)
    assert rows == [["0.00-0.05", 2, "0.005", "0.000"], ["0.05-0.20", 2, "0.125", "0.500"],
                    ["0.20-0.50", 1, "0.300", "1.000"], ["0.80-0.95", 1, "0.900", "1.000"],
                    ["0.95-1.00", 1, "1.000", "1.000"]]


def test_a_tools_report_is_kept_as_a_finished_run_beside_the_scored_ones(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    from rul.tracking.logged_models import log_report

    client = MlflowClient(mlflow_store.uri)  # no global experiment left for later tests
    scored = client.create_run(client.create_experiment("rul-fd001"))
    client.set_terminated(scored.info.run_id)
    run_id = log_report("| a | b |\n| --- | --- |", "interval-report", [scored.info.run_id],
                        client)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "interval-report"
    assert run.info.experiment_id == scored.info.experiment_id
    assert run.data.tags["rul.kind"] == "report"
    assert run.data.tags["rul.report_runs"] == scored.info.run_id
    path = client.download_artifacts(run_id, "interval-report.md", str(tmp_path))
    assert Path(path).read_text() == "| a | b |\n| --- | --- |"


def test_a_lean_logged_model_is_read_back_with_its_validation_engines(fd001_store, fd001):
    """Tools read a model logged today (ONNX served, torch weights beside) from the run's
    weights: the validation engines of its split, every full window, its own predictions."""
    from rul.tracking.logged_models import load_logged
    from rul.training.batching import WindowBatches
    from rul.training.predict import predict_windows
    from rul.workflows.train import train_tracked

    # device=cpu: the logged model predicts on the CPU, to 1e-5 of the training's CPU numbers
    outcome, run_id = train_tracked(fd001_store.config(device="cpu"), progress=False)
    logged = load_logged(run_id)
    windows, members = logged.validation(fd001)
    np.testing.assert_array_equal(windows.units, outcome.data.val.units)
    np.testing.assert_array_equal(windows.targets, outcome.data.val.targets)
    expected = predict_windows(outcome.model, WindowBatches(outcome.data.val, "cpu"))
    np.testing.assert_allclose(members[0], expected, atol=1e-5)
    assert logged.track == "sensors" and logged.preprocessor.rul_cap == 125


# ------------------------------------------------------------------ tools/validation_limits.py


@pytest.fixture(scope="module")
def limits_tool():
    return load_tool("validation_limits")


def test_errors_by_true_rul_count_each_engine_once_and_split_the_squared_error(limits_tool):
    """Two engines, each counted once: engine 1 (2 points, true 10 and 100) errs +2 and -4,
    engine 2 (4 points, true 10, 50, 60, 100) errs +2, +6, +6 and 0. Weights 1/2 per point of
    engine 1, 1/4 of engine 2, halved over the two engines."""
    true = np.array([10.0, 100.0, 10.0, 50.0, 60.0, 100.0])
    error = np.array([2.0, -4.0, 2.0, 6.0, 6.0, 0.0])
    weights = np.array([0.5, 0.5, 0.25, 0.25, 0.25, 0.25])
    found = limits_tool.band_errors(true + error, true, weights)
    w = weights / 2
    total = np.sum(w * error ** 2)  # 0.25*4 + 0.25*16 + 0.125*(4+36+36+0) = 14.5
    assert found["rmse"] == pytest.approx(np.sqrt(total)) == pytest.approx(np.sqrt(14.5))
    low, middle, high = found["rul_le25"], found["rul_26_75"], found["rul_gt75"]
    assert (low["rmse"], low["bias"], low["points"]) == (pytest.approx(2.0), pytest.approx(2.0),
                                                         pytest.approx(0.375))
    assert (middle["rmse"], middle["bias"]) == (pytest.approx(6.0), pytest.approx(6.0))
    assert high["bias"] == pytest.approx((0.25 * -4) / 0.375)  # late positive, early negative
    assert high["squared"] == pytest.approx(0.25 * 16 / 14.5)
    assert low["squared"] + middle["squared"] + high["squared"] == pytest.approx(1.0)


def test_the_curves_are_read_per_epoch_on_the_targets_scale(limits_tool, mlflow_store):
    """Validation RMSE per epoch as logged; the training loss (MSE of RUL / cap) as cycles;
    the first epoch within 0.1 of the best, and the best's epoch."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_store.uri)
    run = client.create_run(client.create_experiment("rul-fd001")).info.run_id
    for epoch, (val, loss) in enumerate([(20.0, 0.04), (12.05, 0.01), (12.0, 0.0064),
                                         (12.3, 0.0049)], start=1):
        client.log_metric(run, "val/rmse", val, step=epoch)
        client.log_metric(run, "train/loss_epoch", loss, step=epoch)
    found = limits_tool.curves(client, run, 125.0)
    assert found["val"] == [20.0, 12.05, 12.0, 12.3]
    assert found["train"] == pytest.approx([25.0, 12.5, 10.0, 8.75])
    assert (found["best"], found["best_epoch"], found["near_epoch"]) == (12.0, 3, 2)
    empty = client.create_run(client.get_run(run).info.experiment_id).info.run_id
    with pytest.raises(ValueError, match=f"run {empty}: no per-epoch"):
        limits_tool.curves(client, empty, 125.0)

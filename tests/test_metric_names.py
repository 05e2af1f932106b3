"""Metric names by group (rul.tracking.metric_names): logged grouped, read in either form, so
runs logged before the groups still read back (registry, Pareto table, aggregates)."""

from types import SimpleNamespace

from rul.tracking import metric_names as names
from rul.tracking.version_description import version_description, version_tags
from rul.tuning.report import _split_value

OLD_RUN = {"test_rmse": 12.5, "test_mae": 9.0, "test_score": 300.0, "val_rmse": 14.0,
           "micro_batch_size": 256.0, "accumulation_steps": 2.0, "effective_batch_size": 512.0}
NEW_RUN = {"test_rmse": 11.5, "test_mae": 8.0, "test_score": 250.0, "val/rmse": 13.0}


def test_training_metrics_are_logged_by_group():
    assert names.logged_metrics({"train_loss": 1, "grad_norm": 2, "lr": 3, "val_rmse": 4,
                                 "samples_per_s": 5, "best_epoch": 6, "test_rmse": 7}) == {
        "train/loss": 1.0, "train/grad_norm": 2.0, "train/lr": 3.0, "val/rmse": 4.0,
        "system/samples_per_s": 5.0, "val/best_epoch": 6.0, "verdict/test/rmse": 7.0}
    assert names.logged("val_rmse_mean") == "val/rmse_mean"
    assert names.logged("val_rmse_std") == "val/rmse_std"
    assert names.logged("test_rmse_mean") == "verdict/test/rmse_mean"
    assert names.plain("val/rmse_mean") == "val_rmse_mean"


def test_single_values_are_grouped_by_what_they_measure():
    """A finished run's single numbers each in a section of their own: the interval's under
    verdict/interval/ (its test figures too), the test figures under verdict/test/, the best
    epoch under val/; only the per-step diagnostics and an ensemble's member summaries stay
    plain."""
    expected = {"test_rmse_uncapped": "verdict/test/rmse_uncapped",
                "test_p_fail_brier": "verdict/test/p_fail_brier",
                "test_units_padded": "verdict/test/units_padded",
                "best_val_rmse": "val/best_rmse",
                "interval_engines": "verdict/interval/engines",
                "interval_coverage_target": "verdict/interval/coverage_target",
                "test_interval_coverage": "verdict/interval/test_coverage",
                "test_interval_width_rul_le25_std": "verdict/interval/test_width_rul_le25_std",
                "member_test_rmse_mean": "member_test_rmse_mean", "clipped": "clipped",
                "epoch": "epoch", "amp_scale": "amp_scale"}
    for name, grouped in expected.items():
        assert names.logged(name) == grouped, name
        assert names.plain(grouped) == name, grouped
        assert names.read({grouped: 1.0}, name) == names.read({name: 1.0}, grouped) == 1.0


def test_the_sections_of_a_finished_run():
    """The UI orders sections (a name less its last part) alphabetically, ungrouped metrics
    last: a finished run's curves (train/, val/) before its results (verdict/interval/,
    verdict/test/)."""
    final = ["test_rmse", "test_interval_width", "interval_engines", "best_epoch", "train_loss",
             "val_rmse", "grad_norm"]
    assert sorted({names.logged(n).rsplit("/", 1)[0] for n in final}) == [
        "train", "val", "verdict/interval", "verdict/test"]


def test_runs_logged_with_the_former_groups_still_read():
    """Runs logged with test/ and interval/ (before verdict/) read back under any name."""
    former = {"test/rmse": 12.0, "interval/test_coverage": 0.9, "test/rmse_mean": 11.0}
    assert names.read(former, "test_rmse") == names.read(former, "verdict/test/rmse") == 12.0
    assert names.read(former, "test_interval_coverage") == 0.9
    assert names.read(former, "test_rmse_mean") == 11.0
    assert names.read({"val/rmse": 3.0}, "val_rmse") == 3.0


def test_either_name_reads_either_run():
    for asked in ("val_rmse", "val/rmse"):
        assert names.read(OLD_RUN, asked) == 14.0
        assert names.read(NEW_RUN, asked) == 13.0
    assert names.read({"val_rmse_mean": 1.0}, "val/rmse_mean") == 1.0
    assert names.read({"samples_per_s": 9.0}, "system/samples_per_s") == 9.0
    assert names.read(NEW_RUN, "test_rmse_uncapped", "n/a") == "n/a"


def test_the_registry_describes_old_and_new_runs_alike():
    for metrics, rmse in ((OLD_RUN, "12.500"), (NEW_RUN, "11.500")):
        run = SimpleNamespace(data=SimpleNamespace(metrics=metrics, params={}, tags={}),
                              info=SimpleNamespace(run_id="r", run_name="n"))
        assert f"reported, never selected on): RMSE {rmse}," in version_description(run, 13.0)
        assert version_tags(run, 13.0)["test_rmse"] == repr(float(rmse))


def test_the_pareto_table_reads_the_split_of_old_and_new_runs():
    params = {"micro_batch_size": "128", "accumulation_steps": "4", "effective_batch_size": "512"}
    assert [_split_value(OLD_RUN, params, k) for k in params] == [256.0, 2.0, 512.0]
    assert [_split_value({}, params, k) for k in params] == ["128", "4", "512"]
    backed_off = {"micro_batch_size": 64.0, "accumulation_steps": 8.0}
    assert [_split_value(backed_off, params, k) for k in params] == [64.0, 8.0, "512"]

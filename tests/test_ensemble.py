"""Ensembles: N members on one validation split, logged and registered as one averaged model.

Module store on the real FD001 data: a poor single model is registered first (champion), then
a tiny 2-member ensemble (which beats it and takes the alias), then a poor ensemble (which
does not). The registered ensemble is loaded by alias and compared with its members' own
logged models.
"""

import math
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from rul import config as cfg
from rul.cli import main
from rul.evaluation.averaging import average_members
from rul.evaluation.ensemble import averaged, combine
from rul.evaluation.intervals import CalibrationSet, fit_interval
from rul.plan import data_settings
from rul.preprocessing.prepared import fitted_preprocessor, prepare_folds
from rul.serving.predictor import predict_frame
from rul.tracking.metric_names import logged
from rul.tracking.parent_run import KIND_TAG
from rul.tracking.registry import CHAMPION
from rul.training.listener import TrainingListener
from rul.training.seeding import derive_seeds
from rul.workflows import ensemble as ensemble_workflow
from rul.workflows.ensemble import FOLD_TAG, MEMBER_TAG, train_ensemble
from rul.workflows.train import train_tracked

ROOT = Path(__file__).resolve().parents[1]
CONFIG_PATH = ROOT / "experiments" / "fd001.yaml"
POOR = {"epochs": 1, "lr": 1e-6}  # barely trained: a high validation RMSE
MODEL = "rul-fd001"
PARENT = "mlflow.parentRunId"


def champion(client) -> str:
    return str(client.get_model_version_by_alias(MODEL, CHAMPION).version)


@pytest.fixture(scope="module")
def poor_single(fd001_store):
    outcome, run_id = train_tracked(fd001_store.config(**POOR), progress=False)
    return SimpleNamespace(outcome=outcome, run_id=run_id)


@pytest.fixture(scope="module")
def ensemble(fd001_store, fd001_client, poor_single):
    config = fd001_store.config(ensemble=2, seed=42)
    outcome, run_id = train_ensemble(config, progress=False)
    parent = fd001_client.get_run(run_id)
    members = fd001_client.search_runs([parent.info.experiment_id],
                                       f"tags.`{PARENT}` = '{run_id}'")
    members = sorted(members, key=lambda r: int(r.data.tags[MEMBER_TAG]))
    return SimpleNamespace(config=config, outcome=outcome, run_id=run_id, parent=parent,
                           members=members, champion_after=champion(fd001_client))


def test_parent_with_a_finished_child_run_per_member(ensemble):
    parent = ensemble.parent
    assert parent.info.status == "FINISHED" and parent.data.tags[KIND_TAG] == "ensemble"
    assert parent.info.run_name == "ensemble-cnn-b1024-k1-s42-x2"
    assert [m.info.status for m in ensemble.members] == ["FINISHED", "FINISHED"]
    assert [m.data.params["seed"] for m in ensemble.members] == ["42", "43"]
    assert parent.data.params["ensemble"] == "2" and parent.data.params["seed"] == "42"
    for member in ensemble.members:  # members are not registered on their own
        assert "registered_version" not in member.data.tags


def test_members_share_the_validation_split_and_preprocessor(ensemble):
    split = str(derive_seeds(42).split)
    assert [m.data.tags["seed.split"] for m in ensemble.members] == [split, split]
    assert [m.data.tags["seed.torch"] for m in ensemble.members] == [
        str(derive_seeds(42).torch), str(derive_seeds(43).torch)]
    first, second = ensemble.outcome.members
    assert first.data is second.data is ensemble.outcome.data
    np.testing.assert_array_equal(first.data.val_units, second.data.val_units)


def test_parent_metrics_are_those_of_the_averaged_prediction(ensemble):
    metrics, outcome = ensemble.parent.data.metrics, ensemble.outcome
    assert metrics["val/rmse"] == pytest.approx(outcome.metrics["val_rmse"], rel=1e-12)
    predicted = outcome.predictions["predicted_rul"].to_numpy()
    members = np.array([m.predictions["predicted_rul"] for m in outcome.members])
    np.testing.assert_allclose(predicted, members.mean(axis=0), rtol=1e-6)
    capped = outcome.predictions["true_rul_capped"].to_numpy()
    assert metrics[logged("test_rmse")] == pytest.approx(
        np.sqrt(np.mean((predicted - capped) ** 2)))
    assert metrics["member_test_rmse_mean"] == pytest.approx(
        np.mean([m.data.metrics[logged("test_rmse")] for m in ensemble.members]))


def test_one_member_ensemble_scores_like_the_single_run(ensemble):
    """The ensemble's val_rmse is the same measure as a single run's best_val_rmse."""
    member = ensemble.outcome.members[0]
    alone = combine(ensemble, [member])
    assert alone.metrics["val_rmse"] == pytest.approx(member.state.best_val_rmse, rel=1e-6)


def test_ensemble_is_registered_and_becomes_champion_when_better(ensemble, fd001_client,
                                                                 poor_single):
    tags = ensemble.parent.data.tags
    version = fd001_client.get_model_version(MODEL, tags["registered_version"])
    assert version.run_id == ensemble.run_id
    poor = fd001_client.get_run(poor_single.run_id).data.metrics[logged("best_val_rmse")]
    assert ensemble.outcome.metrics["val_rmse"] < poor
    assert ensemble.champion_after == tags["registered_version"]
    assert tags["champion_promoted"] == "true"
    assert float(version.tags["val_rmse"]) == pytest.approx(ensemble.outcome.metrics["val_rmse"])


@pytest.mark.slow
def test_a_worse_ensemble_does_not_take_the_champion(fd001_store, fd001_client, ensemble):
    outcome, run_id = train_ensemble(fd001_store.config(ensemble=2, seed=7, **POOR),
                                     progress=False)
    tags = fd001_client.get_run(run_id).data.tags
    assert outcome.metrics["val_rmse"] > ensemble.outcome.metrics["val_rmse"]
    assert tags["champion_promoted"] == "false"
    assert champion(fd001_client) == ensemble.champion_after != tags["registered_version"]


def test_model_by_alias_averages_the_members_on_raw_rows(ensemble, fd001_client, fd001):
    """Raw test rows in; `rul` is the mean of the members' own logged models, `rul_std`
    their spread."""
    version = ensemble.parent.data.tags["registered_version"]
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}/{version}")
    by_alias = mlflow.pyfunc.load_model(f"models:/{MODEL}@{CHAMPION}")
    rows = fd001.test
    result = by_alias.predict(rows)
    pd.testing.assert_frame_equal(result, model.predict(rows))
    assert list(result.columns) == ["unit", "rul", "rul_lower", "rul_upper", "p_fail_within",
                                    "padded", "rul_std", "flagged", "flag_reason"]
    # the ensemble's own interval: calibrated on its averaged validation predictions
    interval = ensemble.outcome.interval
    member = ensemble.outcome.members[0]
    expected = fit_interval(CalibrationSet.of(averaged(ensemble.outcome.members, member.data.val)
                                              [0], member.data.val), 0.9, member.plan.seeds.split,
                            ensemble.outcome.plan.config.rul_cap)
    assert interval == expected != member.interval
    assert ensemble.parent.data.metrics[logged("interval_engines")] == 20
    cap = ensemble.outcome.plan.config.rul_cap
    lower, upper = interval.bounds(result["rul"].to_numpy(), high=cap)
    np.testing.assert_allclose(result["rul_lower"], lower)
    np.testing.assert_allclose(result["rul_upper"], upper)
    np.testing.assert_allclose(result["p_fail_within"],
                               interval.failure_probability(result["rul"].to_numpy(), 20))
    members = [mlflow.pyfunc.load_model(f"runs:/{m.info.run_id}/model").predict(rows)
               for m in ensemble.members]
    stacked = np.array([m["rul"].to_numpy() for m in members])
    np.testing.assert_allclose(result["rul"], stacked.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(result["rul_std"], stacked.std(axis=0), rtol=1e-9, atol=1e-12)
    assert (result["rul_std"] > 0).mean() > 0.5  # two different networks (equal at the cap)
    # the same numbers as the training side's averaged test prediction
    np.testing.assert_allclose(result["rul"], ensemble.outcome.predictions["predicted_rul"],
                               atol=1e-3, rtol=0)  # ONNX against torch


def test_single_model_output_is_unchanged(poor_single, fd001):
    single = predict_frame(poor_single.outcome.data.preprocessor, poor_single.outcome.model,
                           fd001.test)
    assert list(single.columns) == ["unit", "rul", "padded"]


def member_predictions_on(member, windows) -> np.ndarray:

    from rul.training.batching import WindowBatches
    from rul.training.predict import predict_windows

    batches = WindowBatches(windows, next(member.model.parameters()).device)  # where it trained
    return np.asarray(predict_windows(member.model, batches), np.float64)


def test_average_members_mean_and_spread():
    mean, spread = average_members([[1.0, 10.0], [3.0, 10.0], [5.0, 10.0]])
    np.testing.assert_allclose(mean, [3.0, 10.0])
    np.testing.assert_allclose(spread, [math.sqrt(8 / 3), 0.0])


# ---------------------------------------------------------------- folds (cross-fitting)


def test_folds_cut_every_training_unit_once_and_share_one_preprocessor(fd001):
    config = cfg.load(CONFIG_PATH, {"ensemble": 3, "ensemble_split": "folds", "seed": 42})
    members = prepare_folds(data_settings(config), config.ensemble, derive_seeds(42).split, fd001)
    units = np.unique(fd001.train["unit"])
    folds = [m.val_units for m in members]
    assert [len(f) for f in folds] == [34, 33, 33]
    np.testing.assert_array_equal(np.sort(np.concatenate(folds)), units)  # each unit once
    for m in members:
        np.testing.assert_array_equal(m.train_units, np.setdiff1d(units, m.val_units))
        assert m.preprocessor is members[0].preprocessor and m.test is members[0].test
        assert len(m.val) == sum(n - config.window + 1 for n in
                                 fd001.train[fd001.train["unit"].isin(m.val_units)]
                                 .groupby("unit").size())
    # fitted on every training unit (the test units never): the scaling of all of them
    everything = fitted_preprocessor(data_settings(config), fd001, fd001.train)[0]
    probe = fd001.train[fd001.train["unit"] == folds[0][0]]
    np.testing.assert_array_equal(members[0].preprocessor.transform(probe),
                                  everything.transform(probe))
    own = fitted_preprocessor(data_settings(config), fd001, fd001.train[fd001.train["unit"].isin(
        members[0].train_units)])[0]  # what a member fitted alone would scale with
    assert not np.allclose(members[0].preprocessor.transform(probe), own.transform(probe))
    # the folds are seed's: another seed cuts others, the same seed the same
    again = prepare_folds(data_settings(config), config.ensemble, derive_seeds(42).split, fd001)
    assert all((a.val_units == b.val_units).all() for a, b in zip(members, again, strict=True))
    other = prepare_folds(data_settings(config.replace(seed=7)), config.ensemble,
                          derive_seeds(7).split, fd001)
    assert not (other[0].val_units.shape == folds[0].shape
                and (other[0].val_units == folds[0]).all())


def test_folds_need_members_and_units(fd001):
    with pytest.raises(cfg.ConfigError, match=r"ensemble_split='folds': needs ensemble >= 2 "
                                              r"\(member i validates on fold i of N\), got "
                                              r"ensemble=1"):
        cfg.load(None, {"ensemble_split": "folds"})
    with pytest.raises(cfg.ConfigError, match="ensemble_split='fold': must be one of shared"):
        cfg.load(None, {"ensemble": 2, "ensemble_split": "fold"})
    with pytest.raises(cfg.ConfigError, match=r"ensemble=101: cannot cut 100 units into 101 "
                                              r"folds \(the training units of FD001\)"):
        prepare_folds(data_settings(cfg.load(None, {"ensemble": 101,
                                                    "ensemble_split": "folds"})), 101,
                      derive_seeds(42).split, fd001)
    assert "ensemble_split" not in cfg.load(None, {"ensemble": 2}).to_dict()  # digest kept
    with pytest.raises(cfg.ConfigError, match="'ensemble_split' is not a tunable"):
        cfg.load_tuning(None, {"search_space": {"ensemble_split": {
            "type": "categorical", "choices": ["shared", "folds"]}}})


@pytest.fixture(scope="module")
def folds_ensemble(fd001_store, fd001_client):
    config = fd001_store.config(ensemble=2, ensemble_split="folds", seed=42, register=False)
    outcome, run_id = train_ensemble(config, progress=False)
    members = fd001_client.search_runs([fd001_client.get_run(run_id).info.experiment_id],
                                       f"tags.`{PARENT}` = '{run_id}'")
    members = sorted(members, key=lambda r: int(r.data.tags[MEMBER_TAG]))
    return SimpleNamespace(config=config, outcome=outcome, run_id=run_id, members=members,
                           parent=fd001_client.get_run(run_id))


def test_folds_ensemble_validates_out_of_fold(folds_ensemble, fd001):
    """Each member early-stops on its own fold; the ensemble's val_rmse is out-of-fold: every
    training unit's windows predicted by the one member that did not train on it, and the
    interval is calibrated on those residuals."""
    outcome, parent = folds_ensemble.outcome, folds_ensemble.parent
    first, second = outcome.members
    assert first.data is not second.data
    assert not set(first.data.val_units) & set(second.data.val_units)
    assert set(first.data.val_units) == set(second.data.train_units)
    assert [m.data.tags[FOLD_TAG] for m in folds_ensemble.members] == ["0", "1"]
    assert parent.data.tags["ensemble.split"] == "folds"
    assert parent.data.params["ensemble_split"] == "folds"
    residuals = []
    for m in outcome.members:
        predicted = member_predictions_on(m, m.data.val)
        residuals.append(predicted - m.data.val.targets)
        assert m.state.best_val_rmse == pytest.approx(
            np.sqrt(np.mean(residuals[-1] ** 2)), rel=1e-5)  # its own fold is its validation
    residuals = np.concatenate(residuals)
    assert len(residuals) == sum(n - 30 + 1 for n in fd001.train.groupby("unit").size())
    assert parent.data.metrics["val/rmse"] == pytest.approx(np.sqrt(np.mean(residuals ** 2)),
                                                           rel=1e-6)
    assert outcome.interval.n_calibration == 100  # every training engine, out of fold
    assert outcome.interval == fit_interval(CalibrationSet.joined(
        [CalibrationSet.of(member_predictions_on(m, m.data.val), m.data.val)
         for m in outcome.members]), 0.9, outcome.members[0].plan.seeds.split,
        outcome.plan.config.rul_cap)
    # the test prediction is still the mean of both members on the same test windows
    np.testing.assert_allclose(
        outcome.predictions["predicted_rul"],
        np.mean([m.predictions["predicted_rul"] for m in outcome.members], axis=0), rtol=1e-6)


def test_folds_ensemble_serves_like_any_ensemble(folds_ensemble, fd001):
    model = mlflow.pyfunc.load_model(f"runs:/{folds_ensemble.run_id}/model")
    result = model.predict(fd001.test)
    assert list(result.columns) == ["unit", "rul", "rul_lower", "rul_upper", "p_fail_within",
                                    "padded", "rul_std", "flagged", "flag_reason"]
    np.testing.assert_allclose(result["rul"], folds_ensemble.outcome.predictions["predicted_rul"],
                               atol=1e-3, rtol=0)  # ONNX against torch


# ---------------------------------------------------------------- bad input, interruptions


def test_ensemble_key_errors():
    for value, said in ((0, "ensemble=0: must be a positive integer"),
                        (1.5, "ensemble=1.5: must be a positive integer")):
        with pytest.raises(cfg.ConfigError, match=said):
            cfg.load(None, {"ensemble": value})
    with pytest.raises(cfg.ConfigError, match="ensemble=2: a study's trials train single"):
        cfg.load_tuning(None, {"ensemble": 2})
    assert "ensemble" not in cfg.load().to_dict()  # single configs keep their digest


@pytest.mark.parametrize("split, validation", [("shared", "val RMSE"),
                                               ("folds", "out-of-fold val RMSE")])
def test_rul_train_sums_up_an_ensemble_in_one_line(split, validation):
    from rul.cli import _ensemble_summary

    config = cfg.load(None, {"ensemble": 3, "ensemble_split": split})
    data = SimpleNamespace(test_units=range(100), val_units=range(20))
    members = [SimpleNamespace(metrics={"test_rmse": r}, data=data)
               for r in (12.345, 13.0, 14.5)]
    outcome = SimpleNamespace(members=members, metrics={
        "test_rmse": 12.1, "member_test_rmse_mean": 13.2816, "test_mae": 9.04,
        "test_score": 250.26, "val_rmse": 11.996}, data=data)
    assert _ensemble_summary(config, outcome) == (
        "\nensemble of 3: test RMSE 12.10 (members 12.35  13.00  14.50; mean 13.28)  "
        f"MAE 9.04  score 250.3  {validation} 12.00")
    data.test_units, data.val_units = range(3), range(1)  # too few to say
    assert _ensemble_summary(config, outcome) == (
        "\nensemble of 3: test RMSE 12.10 from 3 engines (members 12.35  13.00  14.50; mean "
        f"13.28)  MAE 9.04  score 250.3  {validation} 12.00 from 1 engine")


def test_an_interrupted_ensemble_says_its_runs_are_killed_and_not_resumable():
    from rul.cli import _after_interrupted_training
    from rul.training.distributed import World

    line = _after_interrupted_training(cfg.load(None, {"ensemble": 2}), ["run"], World(),
                                       ["rul", "train"])
    assert line == "the ensemble's runs are marked KILLED; run the command again to train it anew"


@pytest.mark.parametrize(("args", "said"), [
    (["ensemble=0"], "ensemble=0: must be a positive integer"),
    (["ensemble=2", "--resume"], "--resume: an ensemble (ensemble=2) is not resumable"),
])
def test_train_refuses_bad_ensembles_with_exit_2_and_no_run(mlflow_store, real_data_dir, args,
                                                            said):
    result = CliRunner().invoke(main, ["train", str(CONFIG_PATH), *args,
                                       f"data_dir={real_data_dir}", "--no-progress"])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert not (mlflow_store.root / "mlflow.db").exists()


class InterruptSecondMember(TrainingListener):
    def on_epoch(self, epoch, step, metrics):
        raise KeyboardInterrupt


@pytest.mark.slow
def test_an_interruption_kills_parent_and_member_and_registers_nothing(fd001_store, fd001_client,
                                                                       ensemble, monkeypatch):
    real = ensemble_workflow.track

    def interrupted(plan, role, store, listener=None, **kwargs):
        listener = InterruptSecondMember() if plan.config.seed == 101 else None
        return real(plan, role, store, listener, **kwargs)

    monkeypatch.setattr(ensemble_workflow, "track", interrupted)
    versions = len(fd001_client.search_model_versions(f"name='{MODEL}'"))
    with pytest.raises(KeyboardInterrupt):
        train_ensemble(fd001_store.config(ensemble=3, seed=100, experiment="stopped"),
                       progress=False)
    stopped = fd001_client.get_experiment_by_name("stopped").experiment_id
    runs = fd001_client.search_runs([stopped])
    status = {r.data.tags.get(MEMBER_TAG, "parent"): r.info.status for r in runs}
    assert status == {"parent": "KILLED", "0": "FINISHED", "1": "KILLED"}
    assert len(fd001_client.search_model_versions(f"name='{MODEL}'")) == versions

"""Nothing is chosen on the test units: tuning and calibration never read the test files.

Two copies of one synthetic C-MAPSS subset differ only in their test files (other sensor
readings, other lengths' worth of cycles, another true RUL for every unit). Everything a run or
a study chooses or calibrates is bit for bit the same on both: each epoch's validation RMSE,
the epoch early stopping keeps, the interval and its predictive distribution (a single model's
and an ensemble's, its validation weighed either way, its training windows drawn either way), a
study's draws, its trials' values and its best trial. Only what is reported on the test units
differs, which shows that the test files were read, and read only for that.
"""

from pathlib import Path

import optuna
import pytest
from conftest import TEST_LENGTHS, frame_to_text, synthetic_frame
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.evaluation.ensemble import combine
from rul.plan import plan_ensemble, plan_run
from rul.tracking.metric_names import logged
from rul.training.run import train
from rul.workflows.tune import run_study

TUNE_PATH = Path(__file__).resolve().parents[1] / "experiments" / "tune_fd001.yaml"
SMALL = {"filters": 4, "hidden_size": 8, "num_layers": 1, "window": 20, "epochs": 3,
         "patience": 5, "precision": "fp32", "device": "cpu", "register": False,
         "micro_batch_size": 16, "accumulation_steps": 2}
TRAIN_LENGTHS = (60,) * 12


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, Path]:
    """'real' and 'other': the same training file; the test files of 'other' hold other
    readings and another true RUL for every test unit."""
    folders = {}
    for name, test_seed, rul in (("real", 1, [10, 17, 24, 31]), ("other", 7, [90, 3, 55, 41])):
        folder = tmp_path_factory.mktemp(name)
        (folder / "train_FD001.txt").write_text(frame_to_text(synthetic_frame(TRAIN_LENGTHS)))
        test = synthetic_frame(TEST_LENGTHS, seed=test_seed)
        (folder / "test_FD001.txt").write_text(frame_to_text(test))
        (folder / "RUL_FD001.txt").write_text("".join(f"{v} \n" for v in rul))
        folders[name] = folder
    return folders


def chosen(outcome) -> dict:
    """What a run chose or calibrated: the validation curve, the kept epoch, the interval."""
    state = outcome.state
    return {"val_rmse": [h["val_rmse"] for h in state.history],
            "best_epoch": state.best_epoch, "interval": outcome.interval.to_dict()}


@pytest.mark.parametrize("weighed", [{"val_weights": "windows"}, {"val_weights": "truncation"},
                                     {"train_sampling": "truncation"}])
def test_early_stopping_and_the_interval_never_read_the_test_files(twins, tmp_path, weighed):
    outcomes = {name: train(plan_run(cfg.load(None, {
        **SMALL, "data_dir": str(folder), **weighed,
        "checkpoint_dir": str(tmp_path / name)})), progress=False)
        for name, folder in twins.items()}
    assert chosen(outcomes["real"]) == chosen(outcomes["other"])
    assert outcomes["real"].metrics["test_rmse"] != outcomes["other"].metrics["test_rmse"]


def test_an_ensembles_validation_and_interval_never_read_the_test_files(twins, tmp_path):
    found = {}
    for name, folder in twins.items():
        config = cfg.load(None, {**SMALL, "data_dir": str(folder), "ensemble": 2,
                                 "ensemble_split": "folds", "val_weights": "truncation",
                                 "checkpoint_dir": str(tmp_path / name)})
        ensemble = plan_ensemble(config)
        members = [train(plan, progress=False) for plan in ensemble.members]
        found[name] = combine(ensemble, members)
    real, other = found["real"], found["other"]
    assert real.metrics["val_rmse"] == other.metrics["val_rmse"]
    assert real.interval.to_dict() == other.interval.to_dict()
    assert [chosen(m)["val_rmse"] for m in real.members] == [
        chosen(m)["val_rmse"] for m in other.members]
    assert real.metrics["test_rmse"] != other.metrics["test_rmse"]


def study_of(folder: Path, root: Path, seeds_per_trial: int) -> dict:
    """A 3-trial study on `folder`, in its own stores: its trials and its best."""
    config = cfg.load_tuning(TUNE_PATH, {
        **SMALL, "data_dir": str(folder), "tracking_uri": f"sqlite:///{root}/mlflow.db",
        "checkpoint_dir": str(root / "ckpt"), "baseline_trial": False,
        "pruner": "none", "seeds_per_trial": seeds_per_trial,
        "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
                         "warmup_epochs": {"type": "int", "low": 0, "high": 2},
                         "val_weights": {"type": "categorical",
                                         "choices": ["windows", "truncation"]}}})
    storage = f"sqlite:///{root}/optuna.db"
    run_study(config, n_trials=3, storage=storage, study_name="unseen")
    study = optuna.load_study(study_name="unseen", storage=storage)
    client = MlflowClient(tracking_uri=config.train.tracking_uri)
    return {"trials": [(t.params, t.values, t.state) for t in study.trials],
            "best": study.best_trial.number,
            "test_rmse": [client.get_run(t.user_attrs["mlflow_run_id"]).data.metrics[
                logged("test_rmse")] for t in study.trials]}


@pytest.mark.parametrize("seeds_per_trial", [1, 2])
def test_a_study_never_reads_the_test_files(twins, tmp_path, mlflow_store_at, seeds_per_trial):
    studies = {}
    for name, folder in twins.items():
        root = tmp_path / name
        root.mkdir()
        with mlflow_store_at(root):
            studies[name] = study_of(folder, root, seeds_per_trial)
    real, other = studies["real"], studies["other"]
    assert {state for _, _, state in real["trials"]} == {optuna.trial.TrialState.COMPLETE}
    assert real["trials"] == other["trials"] and real["best"] == other["best"]
    assert all(a != b for a, b in zip(real["test_rmse"], other["test_rmse"], strict=True))

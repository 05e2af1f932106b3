"""Optuna tuning end to end: `run_study` on the real FD001 data with tiny trials.

Each study lives in its own temporary MLflow store (sqlite + ./mlruns, working directory inside
it). The main study (3 trials, then resumed with 1 more) is shared by several tests through
module fixtures; pruning, failures and parallel workers get small studies of their own.
Trials are tiny CNNs trained for 2-3 epochs on CPU; the whole file runs in a few minutes.
"""

from pathlib import Path
from types import SimpleNamespace

import mlflow
import optuna
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from rul import config as cfg
from rul.tracking.metric_names import logged
from rul.tracking.registry import CHAMPION
from rul.training.listener import TrainingListener
from rul.tuning.space import REFERENCE_BATCH, suggest, trial_overrides
from rul.tuning.storage import open_storage
from rul.tuning.study import load_study, make_pruner
from rul.workflows import tune as study_mod
from rul.workflows.tune import run_study

TUNE_PATH = Path(__file__).resolve().parents[1] / "experiments" / "tune_fd001.yaml"
MODEL_NAME = "rul-fd001"
# make tune's file without its baseline trial, its batch limited: the study's mechanics
PLAIN = {"baseline_trial": False, "max_effective_batch": 2048}
PLAIN_ARGS = ["baseline_trial=false", "max_effective_batch=2048"]
TINY = {"epochs": 2, "patience": 5, "filters": 4, "num_layers": 2, "hidden_size": 16}
SPACE = {
    "micro_batch_size": {"type": "categorical", "choices": [1024, 2048]},
    "accumulation_steps": {"type": "categorical", "choices": [1, 2]},
    "lr": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
}
N_TRIALS = 3
STUDY = "tune-main"


def make_config(root: Path, data_dir: Path, **changes) -> cfg.TuningConfig:
    return cfg.load_tuning(TUNE_PATH, {
        **TINY, "data_dir": str(data_dir), "tracking_uri": f"sqlite:///{root}/mlflow.db",
        "checkpoint_dir": str(root / "ckpt"), "search_space": SPACE,
        "max_effective_batch": None, "baseline_trial": False, "pruner_warmup_epochs": 3,
        "promote": True, **changes,
    })


def experiment_id(client: MlflowClient) -> str:
    return client.get_experiment_by_name(MODEL_NAME).experiment_id  # experiment rul-fd001


def study_runs(client: MlflowClient, study_name: str) -> list:
    """Every run tagged with the study: the parent and its trials' child runs."""
    return client.search_runs([experiment_id(client)],
                              filter_string=f"tags.`optuna.study` = '{study_name}'",
                              max_results=1000)


def parents_of(runs) -> list:
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def child_runs_by_trial(client: MlflowClient, parent_run_id: str) -> dict:
    runs = client.search_runs([experiment_id(client)],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
                              max_results=1000)
    by_trial = {}
    for run in runs:
        number = int(run.data.tags["optuna.trial"])
        assert number not in by_trial, f"two child runs for trial {number}"
        by_trial[number] = run
    return by_trial


def metric_values(client: MlflowClient, run_id: str, key: str) -> dict:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def per_epoch(client: MlflowClient, run_id: str, key: str) -> dict:
    """{epoch: value} of an epoch metric (logged at the optimizer step where its epoch ended)."""
    epoch_at = {m.step: int(m.value) for m in client.get_metric_history(run_id, "epoch")}
    return {epoch_at[step]: value for step, value in metric_values(client, run_id, key).items()}


# ---------------------------------------------------------------- the main study (3 + 1 trials)


@pytest.fixture(scope="module")
def main_store(tmp_path_factory, real_data_dir, mlflow_store_at):
    root = tmp_path_factory.mktemp("tune-main")
    with mlflow_store_at(root):
        yield SimpleNamespace(root=root, storage=f"sqlite:///{root}/optuna.db",
                              config=make_config(root, real_data_dir))


@pytest.fixture(scope="module")
def tuned(main_store):
    """The first invocation: 3 trials. Everything the tests read is snapshotted here, before
    the `resumed` fixture adds a trial to the same study and store."""
    config = main_store.config
    summary = run_study(config, n_trials=N_TRIALS, storage=main_store.storage, study_name=STUDY)
    study = optuna.load_study(study_name=STUDY, storage=main_store.storage)
    client = MlflowClient(tracking_uri=config.train.tracking_uri)
    parent_run_id = study.user_attrs["mlflow_parent_run_id"]
    versions = client.search_model_versions(f"name = '{MODEL_NAME}'")
    return SimpleNamespace(
        config=config, summary=summary, client=client, parent_run_id=parent_run_id,
        trials=study.get_trials(deepcopy=True), best_trial=study.best_trial,
        best_value=study.best_value, parent=client.get_run(parent_run_id),
        children=child_runs_by_trial(client, parent_run_id), runs=study_runs(client, STUDY),
        versions=versions, champion=client.get_model_version_by_alias(MODEL_NAME, CHAMPION),
    )


@pytest.fixture(scope="module")
def resumed(main_store, tuned):
    """The same command again, one more trial: the study and the parent run are reused."""
    summary = run_study(main_store.config, n_trials=1, storage=main_store.storage,
                        study_name=STUDY)
    study = optuna.load_study(study_name=STUDY, storage=main_store.storage)
    client = tuned.client
    parent_run_id = study.user_attrs["mlflow_parent_run_id"]
    return SimpleNamespace(
        summary=summary, study=study, trials=study.get_trials(deepcopy=True),
        parent_run_id=parent_run_id, parent=client.get_run(parent_run_id),
        children=child_runs_by_trial(client, parent_run_id), runs=study_runs(client, STUDY),
        versions=client.search_model_versions(f"name = '{MODEL_NAME}'"),
        champion=client.get_model_version_by_alias(MODEL_NAME, CHAMPION),
    )


def test_study_runs_the_requested_trials_to_completion(tuned):
    assert [t.number for t in tuned.trials] == list(range(N_TRIALS))
    assert all(t.state == TrialState.COMPLETE for t in tuned.trials)
    for trial in tuned.trials:
        assert set(trial.params) == set(SPACE)
        assert trial.params["micro_batch_size"] in (1024, 2048)
        assert trial.params["accumulation_steps"] in (1, 2)
        assert 1e-4 <= trial.params["lr"] <= 3e-3
        # one report per epoch (patience 5 > 2 epochs: no early stop); value = best of them
        assert sorted(trial.intermediate_values) == [1, 2]
        assert trial.value == min(trial.intermediate_values.values())
        assert 0 < trial.value < 150  # validation RMSE on a 125-cycle cap
    assert tuned.best_value == min(t.value for t in tuned.trials)
    assert tuned.summary.startswith(f"study {STUDY}: {N_TRIALS} trials complete {N_TRIALS}")
    assert f"best trial {tuned.best_trial.number}: val_rmse {tuned.best_value:.3f}" \
        in tuned.summary


def test_one_parent_run_with_a_child_run_per_trial(tuned):
    parents = parents_of(tuned.runs)
    assert [p.info.run_id for p in parents] == [tuned.parent_run_id]
    assert tuned.parent.info.run_name == STUDY
    assert tuned.parent.data.tags["optuna.study"] == STUDY
    assert tuned.parent.data.params["search_space"] == str(SPACE)
    assert len(tuned.runs) == N_TRIALS + 1  # the parent and one child per trial, no more
    assert sorted(tuned.children) == [t.number for t in tuned.trials]
    for trial in tuned.trials:
        run = tuned.children[trial.number]
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        assert trial.user_attrs["mlflow_run_id"] == run.info.run_id
        assert tags["mlflow.parentRunId"] == tuned.parent_run_id
        assert tags["optuna.trial"] == str(trial.number)
        assert tags["optuna.study"] == STUDY
        assert tags["optuna.trial_state"] == trial.state.name == "COMPLETE"
        assert run.info.run_name == f"trial-{trial.number:03d}"
        assert run.info.status == "FINISHED"
        # the study's parent describes the data its trials trained on, as each trial does
        data = {k: v for k, v in tags.items() if k.startswith("data.") or k == "subset"}
        assert data and {k: tuned.parent.data.tags.get(k) for k in data} == data
        # the trial's suggested values are what the child run trained with
        assert params["micro_batch_size"] == str(trial.params["micro_batch_size"])
        assert params["accumulation_steps"] == str(trial.params["accumulation_steps"])
        assert params["lr"] == str(trial.params["lr"])  # scale_lr_with_batch is off
        assert params["effective_batch_size"] == str(
            trial.params["micro_batch_size"] * trial.params["accumulation_steps"])
        assert params["epochs"] == "2" and params["hidden_size"] == "16"
        assert params["register"] == "False"  # trials never register; the study does
        # Optuna's value and reports are the run's validation RMSE
        assert metrics[logged("best_val_rmse")] == pytest.approx(trial.value, rel=1e-12)
        assert per_epoch(tuned.client, run.info.run_id, "val/rmse") == pytest.approx(
            trial.intermediate_values, rel=1e-12)


def test_parent_run_records_the_best_trial(tuned):
    parent = tuned.parent
    assert parent.info.status == "FINISHED"
    metrics, tags = parent.data.metrics, parent.data.tags
    assert metrics[logged("best_val_rmse")] == pytest.approx(tuned.best_value, rel=1e-12)
    assert metrics["trials_complete"] == N_TRIALS
    assert "trials_pruned" not in metrics and "trials_fail" not in metrics
    assert tags["best_trial"] == str(tuned.best_trial.number)
    for key, value in tuned.best_trial.params.items():
        assert tags[f"best.{key}"] == str(value)
    artifacts = {a.path for a in tuned.client.list_artifacts(tuned.parent_run_id)}
    assert "trials.csv" in artifacts
    figures = {a.path for a in tuned.client.list_artifacts(tuned.parent_run_id, "figures")}
    assert "figures/optimization_history.png" in figures
    assert "figures/param_importances.png" in figures  # 3 completed trials, lr varies
    assert not [k for k in tags if k.startswith("figure_skipped.")]


def test_trials_csv_lists_every_trial(tuned, tmp_path):
    path = mlflow.artifacts.download_artifacts(run_id=tuned.parent_run_id,
                                               artifact_path="trials.csv", dst_path=str(tmp_path),
                                               tracking_uri=tuned.config.train.tracking_uri)
    table = pd.read_csv(path)
    assert list(table["number"]) == [t.number for t in tuned.trials]
    assert list(table["state"]) == ["COMPLETE"] * N_TRIALS
    assert list(table["value"]) == pytest.approx([t.value for t in tuned.trials], rel=1e-9)
    assert list(table["params_lr"]) == pytest.approx([t.params["lr"] for t in tuned.trials])


def test_best_trial_model_is_registered_as_champion(tuned):
    best_run_id = tuned.best_trial.user_attrs["mlflow_run_id"]
    assert len(tuned.versions) == 1  # only the study registers, not each trial
    version = tuned.versions[0]
    assert version.run_id == best_run_id
    assert float(version.tags["val_rmse"]) == tuned.best_value  # stored exactly (repr)
    assert tuned.champion.version == version.version
    tags = tuned.parent.data.tags
    assert tags["registered_model"] == MODEL_NAME
    assert tags["registered_version"] == str(version.version)
    assert tags["champion_promoted"] == "true"
    assert (f"registered {MODEL_NAME} version {version.version}; champion: version "
            f"{version.version} (this version): the best of the versions scored on the same "
            "engines, score and data") in tuned.summary


def test_resume_adds_trials_to_the_same_study_and_parent_run(tuned, resumed):
    assert len(resumed.trials) == N_TRIALS + 1
    assert [t.number for t in resumed.trials] == list(range(N_TRIALS + 1))
    new = resumed.trials[-1]
    assert new.state == TrialState.COMPLETE
    # earlier trials are untouched
    for before, after in zip(tuned.trials, resumed.trials[:N_TRIALS]):
        assert (after.state, after.value, after.params) == (before.state, before.value,
                                                            before.params)
    assert resumed.parent_run_id == tuned.parent_run_id
    assert [p.info.run_id for p in parents_of(resumed.runs)] == [tuned.parent_run_id]
    assert len(resumed.runs) == N_TRIALS + 2
    assert sorted(resumed.children) == list(range(N_TRIALS + 1))
    child = resumed.children[new.number]
    assert child.info.run_id == new.user_attrs["mlflow_run_id"]
    assert child.data.tags["mlflow.parentRunId"] == tuned.parent_run_id
    assert child.data.tags["optuna.trial_state"] == "COMPLETE"
    # the parent was reopened and finished again, its counts follow the study
    assert resumed.parent.info.status == "FINISHED"
    counts = metric_values(tuned.client, tuned.parent_run_id, "trials_complete")
    assert counts == {N_TRIALS: N_TRIALS, N_TRIALS + 1: N_TRIALS + 1}
    best_value = min(t.value for t in resumed.trials)
    assert resumed.study.best_value == best_value
    assert resumed.parent.data.metrics[logged("best_val_rmse")] == pytest.approx(best_value,
                                                                                rel=1e-12)
    assert resumed.summary.startswith(f"study {STUDY}: {N_TRIALS + 1} trials complete")


def test_resumed_study_does_not_replay_earlier_trials(tuned, resumed):
    """A resumed study should explore: the new trial's lr (a continuous value) is not an exact
    copy of an earlier trial's."""
    earlier = [t.params for t in tuned.trials]
    assert resumed.trials[-1].params not in earlier, (
        f"resumed trial repeats an earlier trial: {resumed.trials[-1].params} in {earlier}")


def unchanged_best_run(tuned, resumed) -> str:
    best_before = tuned.best_trial.user_attrs["mlflow_run_id"]
    if resumed.study.best_trial.user_attrs["mlflow_run_id"] != best_before:
        pytest.skip("the resumed trial improved on the best; the registry is expected to move")
    return best_before


def test_resume_keeps_the_champion_when_the_best_is_unchanged(tuned, resumed):
    """Same best trial, same val_rmse: not an improvement, so champion must not move."""
    unchanged_best_run(tuned, resumed)
    assert resumed.study.best_value == tuned.best_value
    assert "already registered" in resumed.summary
    assert resumed.champion.version == tuned.champion.version


def test_resume_does_not_register_the_same_best_run_twice(tuned, resumed):
    best_run = unchanged_best_run(tuned, resumed)
    versions = [v.version for v in resumed.versions if v.run_id == best_run]
    assert len(versions) == 1, f"the same best run was registered again: versions {versions}"


# ---------------------------------------------------------------- pruning


def test_resuming_with_another_base_config_is_a_one_line_error(main_store, tuned, resumed):
    """Trials of two base configs under one best would compare apples with pears."""
    config = main_store.config.replace(epochs=3, scheduler="none")
    with pytest.raises(cfg.ConfigError) as error:
        run_study(config, n_trials=1, storage=main_store.storage, study_name=STUDY)
    assert str(error.value) == (
        f"study {STUDY!r}: its trials were trained with epochs=2, scheduler='cosine'; this "
        "config has epochs=3, scheduler='none': tune it with the study's values, or name a new "
        "study (--study-name)")
    study = optuna.load_study(study_name=STUDY, storage=main_store.storage)
    assert len(study.trials) == len(resumed.trials)  # nothing ran, no run was created
    assert len(study_runs(tuned.client, STUDY)) == len(resumed.runs)


def base_study(space=SPACE, trained=True, **changes):
    """A study created by load_study in memory, with a trial running unless not `trained`
    (nothing is trained for real), and a config to resume it."""
    config = cfg.load_tuning(TUNE_PATH, {**PLAIN, "search_space": space, **changes})
    storage = optuna.storages.InMemoryStorage()
    load_study(config, storage, "s")
    if trained:
        optuna.load_study(study_name="s", storage=storage).ask()
    return config, storage


@pytest.mark.parametrize("change", [
    {"data_dir": "/elsewhere"}, {"tracking_uri": "sqlite:///other.db"}, {"device": "cpu"},
    {"micro_batch_size": "auto", "effective_batch_size": 512}, {"memory_budget": "2GiB"},
    {"precision": "fp32"}, {"accumulation_steps": 8},  # B = micro x K, both drawn
    {"checkpoint_dir": "ckpt"}, {"n_trials": 50}, {"pruner": "none"},
    {"lr": 0.1},  # drawn by the search space: the base value is never trained
    {"search_space": {**SPACE, "dropout": {"type": "float", "low": 0.0, "high": 0.5}},
     "dropout": 0.3},  # the space may change; a newly drawn key is not compared
])
def test_where_and_how_fast_may_differ_when_a_study_resumes(change):
    config, storage = base_study()
    load_study(config.replace(**change), storage, "s")


@pytest.mark.parametrize("change,had", [
    ({"seed": 7}, "seed=42"),  # another validation split
    ({"window": 40}, "window=30"),
    ({"rul_cap": 130}, "rul_cap=125"),
    ({"scale_lr_with_batch": True}, "scale_lr_with_batch=False"),
    ({"seeds_per_trial": 3}, "seeds_per_trial=1"),  # a mean over other splits
])
def test_what_trials_train_may_not_differ_when_a_study_resumes(change, had):
    config, storage = base_study()
    key = next(iter(change))
    with pytest.raises(cfg.ConfigError, match=f"its trials were trained with {had}; this config "
                                              f"has {key}="):
        load_study(config.replace(**change), storage, "s")


@pytest.mark.parametrize("space,change,key", [
    ({"effective_batch_size": {"type": "categorical", "choices": [256, 512]}},
     {"micro_batch_size": 128, "accumulation_steps": 8}, None),  # a split of a drawn B
    ({"lr": {"type": "float", "low": 1e-4, "high": 1e-2}},
     {"micro_batch_size": 128, "accumulation_steps": 4}, None),  # another split of the same B
    ({"lr": {"type": "float", "low": 1e-4, "high": 1e-2}},
     {"micro_batch_size": 128, "accumulation_steps": 2}, "effective_batch_size"),  # 512 -> 256
    ({"micro_batch_size": {"type": "categorical", "choices": [128, 256]}},
     {"accumulation_steps": 4}, "accumulation_steps"),  # B = drawn micro x base K
    ({"accumulation_steps": {"type": "categorical", "choices": [1, 2]}},
     {"micro_batch_size": 512}, "micro_batch_size"),  # B = base micro x drawn K
])
def test_the_batch_keys_compared_are_those_that_decide_the_trials_batch(space, change, key):
    config, storage = base_study(space)
    if key is None:
        load_study(config.replace(**change), storage, "s")
    else:
        with pytest.raises(cfg.ConfigError, match=f"trained with {key}="):
            load_study(config.replace(**change), storage, "s")


def test_a_study_from_before_the_check_adopts_the_config_it_resumes_with(capsys):
    config = cfg.load_tuning(TUNE_PATH, {**PLAIN, "search_space": SPACE})
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="s").ask()  # a trial, no base config
    load_study(config.replace(epochs=7), storage, "s")
    assert "study 's' has no stored base config (made by an older rul)" in capsys.readouterr().err
    with pytest.raises(cfg.ConfigError, match="trained with epochs=7; this config has epochs=35"):
        load_study(config, storage, "s")


def test_a_study_whose_trials_all_failed_takes_the_corrected_config():
    """epochs=1000 by mistake, every trial failed or was stopped: the rerun is not refused."""
    config, storage = base_study(trained=False, epochs=1000)
    study = optuna.load_study(study_name="s", storage=storage)
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    load_study(config.replace(epochs=12), storage, "s")
    study.ask()  # a trial running with epochs=12: now the study keeps that
    with pytest.raises(cfg.ConfigError, match="trained with epochs=12; this config has epochs=9"):
        load_study(config.replace(epochs=9), storage, "s")


@pytest.fixture(scope="module")
def pruning(tmp_path_factory, real_data_dir, mlflow_store_at):
    """Median pruning from epoch 1, made deterministic by enqueued trials: two good ones (so the
    median pruner has its 2 startup trials), one with a useless lr, one over the batch limit;
    then one trial drawn by the sampler."""
    root = tmp_path_factory.mktemp("tune-pruning")
    with mlflow_store_at(root):
        space = {**SPACE, "lr": {"type": "categorical", "choices": [3e-3, 1e-7]}}
        config = make_config(root, real_data_dir, epochs=3, pruner="median",
                             pruner_warmup_epochs=0, max_effective_batch=2048,
                             search_space=space, register=False)
        storage, name = f"sqlite:///{root}/optuna.db", "tune-pruning"
        study = load_study(config, storage, name)
        good = {"micro_batch_size": 2048, "accumulation_steps": 1, "lr": 3e-3}
        for params in (good, good, {**good, "lr": 1e-7},
                       {"micro_batch_size": 2048, "accumulation_steps": 2, "lr": 3e-3}):
            study.enqueue_trial(params)
        summary = run_study(config, n_trials=5, storage=storage, study_name=name)
        study = optuna.load_study(study_name=name, storage=storage)
        client = MlflowClient(tracking_uri=config.train.tracking_uri)
        parent_run_id = study.user_attrs["mlflow_parent_run_id"]
        yield SimpleNamespace(summary=summary, trials=study.get_trials(deepcopy=True),
                              client=client, parent_run_id=parent_run_id,
                              children=child_runs_by_trial(client, parent_run_id))


def test_enqueued_trials_run_first_then_sampled_ones(pruning):
    # n_trials counts trials that run: the 4 enqueued (WAITING) ones + 1 sampled
    assert len(pruning.trials) == 5
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in pruning.trials)
    assert [t.params["lr"] for t in pruning.trials[:4]] == [3e-3, 3e-3, 1e-7, 3e-3]
    good = pruning.trials[:2]
    assert [t.state for t in good] == [TrialState.COMPLETE] * 2
    for trial in good:
        assert sorted(trial.intermediate_values) == [1, 2, 3]
    # same seed, same config: the two good trials are the same training
    assert good[0].intermediate_values == pytest.approx(good[1].intermediate_values, rel=1e-6)


def test_a_hopeless_trial_is_pruned_after_its_first_epoch(pruning):
    good, bad = pruning.trials[:2], pruning.trials[2]
    assert bad.state == TrialState.PRUNED
    assert sorted(bad.intermediate_values) == [1]  # stopped after the first report
    # worse than the median (here: both) of the completed trials at epoch 1
    assert bad.intermediate_values[1] > max(t.intermediate_values[1] for t in good)
    assert bad.value == bad.intermediate_values[1]  # Optuna keeps the last report
    assert bad.user_attrs["reason"].startswith("pruned at epoch 1: val_rmse ")
    run = pruning.children[bad.number]
    assert run.info.run_id == bad.user_attrs["mlflow_run_id"]
    assert run.info.status == "FINISHED"  # stopped by policy, not broken
    assert run.data.tags["optuna.trial_state"] == "PRUNED"
    assert run.data.tags["optuna.reason"] == bad.user_attrs["reason"]
    assert run.data.tags["stopped"] == bad.user_attrs["reason"]  # ended where it stopped
    assert "error" not in run.data.tags
    assert run.data.tags["mlflow.parentRunId"] == pruning.parent_run_id
    val = per_epoch(pruning.client, run.info.run_id, "val/rmse")
    assert val == pytest.approx(bad.intermediate_values, rel=1e-12)
    assert f"val_rmse {val[1]:.3f}" in bad.user_attrs["reason"]


def test_a_trial_over_the_effective_batch_limit_is_pruned_before_running(pruning):
    big = pruning.trials[3]
    assert big.params == {"micro_batch_size": 2048, "accumulation_steps": 2, "lr": 3e-3}
    assert big.state == TrialState.PRUNED
    assert big.user_attrs["prune_reason"] == "effective batch 2048x2=4096 > max 2048"
    assert "mlflow_run_id" not in big.user_attrs  # never trained: no MLflow run
    assert big.intermediate_values == {}
    assert big.number not in pruning.children


def test_pruning_study_parent_counts_states(pruning):
    parent = pruning.client.get_run(pruning.parent_run_id)
    assert parent.info.status == "FINISHED"
    states = [t.state for t in pruning.trials]
    metrics = parent.data.metrics
    assert metrics["trials_complete"] == states.count(TrialState.COMPLETE)
    assert metrics["trials_pruned"] == states.count(TrialState.PRUNED) >= 2
    best = min((t for t in pruning.trials if t.state == TrialState.COMPLETE),
               key=lambda t: t.value)
    assert metrics[logged("best_val_rmse")] == pytest.approx(best.value, rel=1e-12)
    assert "registered_version" not in parent.data.tags  # register=False
    assert pruning.client.search_registered_models() == []
    # every trial that trained has exactly one child run, with its state
    for trial in pruning.trials:
        if "mlflow_run_id" in trial.user_attrs:
            run = pruning.children[trial.number]
            assert run.data.tags["optuna.trial_state"] == trial.state.name


# ---------------------------------------------------------------- failures


def test_a_trial_whose_config_the_data_refuses_is_pruned_in_one_line(
        tmp_path, real_data_dir, mlflow_store_at, capfd):
    """A window longer than every training unit: each trial pruned before training with the
    reason (no run, no traceback); before, each failed with Optuna's traceback."""
    config = make_config(tmp_path, real_data_dir, register=False,
                         search_space={"window": {"type": "int", "low": 500, "high": 600}})
    storage, name = f"sqlite:///{tmp_path}/optuna.db", "tune-refused"
    with mlflow_store_at(tmp_path):
        run_study(config, n_trials=2, storage=storage, study_name=name)
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert [t.state for t in trials] == [TrialState.PRUNED] * 2
    said = capfd.readouterr().err
    assert "Traceback" not in said and "failed" not in said
    for trial in trials:
        reason = trial.user_attrs["prune_reason"]
        assert reason.startswith(f"window={trial.params['window']}: ") and "FD001" in reason
        assert f"trial {trial.number}: pruned before training: {reason}\n" in said
        assert "mlflow_run_id" not in trial.user_attrs


def test_failing_trials_are_recorded_and_the_study_goes_on(tmp_path, monkeypatch, real_data_dir,
                                                           mlflow_store_at):
    """1st trial: track raises before any run; 2nd: CUDA out of memory (pruned, not
    failed); 3rd: an error inside the MLflow run after one epoch; 4th: a normal trial."""
    config = make_config(tmp_path, real_data_dir, register=False)
    real = study_mod.track
    calls = []

    def flaky(plan, role, store, listener=None, **kwargs):
        calls.append(role.name)
        if len(calls) == 1:
            raise RuntimeError("boom")
        if len(calls) == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        if len(calls) == 3:
            class Failing(TrainingListener):
                def on_epoch(self, epoch, step, metrics):
                    raise RuntimeError("boom in epoch")

            listener = Failing()
        return real(plan, role, store, listener, **kwargs)

    monkeypatch.setattr(study_mod, "track", flaky)
    storage, name = f"sqlite:///{tmp_path}/optuna.db", "tune-failures"
    with mlflow_store_at(tmp_path):
        summary = run_study(config, n_trials=4, storage=storage, study_name=name)
    assert calls == ["trial-000", "trial-001", "trial-002", "trial-003"]
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.PRUNED, TrialState.FAIL,
                                         TrialState.COMPLETE]
    assert trials[0].user_attrs["reason"] == "RuntimeError: boom"
    assert "mlflow_run_id" not in trials[0].user_attrs
    assert trials[1].user_attrs["reason"] == (
        f"CUDA out of memory at micro_batch_size={trials[1].params['micro_batch_size']}")
    assert trials[2].user_attrs["reason"] == "RuntimeError: boom in epoch"
    assert trials[3].value == min(trials[3].intermediate_values.values())
    assert "reason" not in trials[3].user_attrs

    client = MlflowClient(tracking_uri=config.train.tracking_uri)
    parent_run_id = study.user_attrs["mlflow_parent_run_id"]
    children = child_runs_by_trial(client, parent_run_id)
    assert sorted(children) == [2, 3]  # trials 0 and 1 never reached MLflow
    failed = children[2]
    assert failed.info.run_id == trials[2].user_attrs["mlflow_run_id"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["optuna.trial_state"] == "FAIL"
    assert failed.data.tags["optuna.reason"] == "RuntimeError: boom in epoch"
    assert failed.data.tags["error"] == "RuntimeError: boom in epoch"
    # the listener raised after the MLflow listener had recorded epoch 1, then nothing more
    assert sorted(per_epoch(client, failed.info.run_id, "val/rmse")) == [1]
    done = children[3]
    assert done.info.status == "FINISHED"
    assert done.data.tags["optuna.trial_state"] == "COMPLETE"
    assert done.data.metrics[logged("best_val_rmse")] == pytest.approx(trials[3].value, rel=1e-12)

    parent = client.get_run(parent_run_id)
    assert parent.info.status == "FINISHED"
    metrics = parent.data.metrics
    assert (metrics["trials_fail"], metrics["trials_pruned"], metrics["trials_complete"]) == (
        2, 1, 1)
    assert metrics[logged("best_val_rmse")] == pytest.approx(trials[3].value, rel=1e-12)
    assert parent.data.tags["best_trial"] == "3"
    assert summary.startswith(f"study {name}: 4 trials ")


def test_no_completed_trial_leaves_nothing_to_register(tmp_path, monkeypatch, real_data_dir,
                                                       mlflow_store_at):
    config = make_config(tmp_path, real_data_dir)

    def broken(plan, role, store, listener=None, **kwargs):
        raise RuntimeError("always")

    monkeypatch.setattr(study_mod, "track", broken)
    storage, name = f"sqlite:///{tmp_path}/optuna.db", "tune-broken"
    with mlflow_store_at(tmp_path):
        summary = run_study(config, n_trials=2, storage=storage, study_name=name)
    study = optuna.load_study(study_name=name, storage=storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2
    assert summary.endswith("no trial completed: nothing to register")
    client = MlflowClient(tracking_uri=config.train.tracking_uri)
    parent = client.get_run(study.user_attrs["mlflow_parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["trials_fail"] == 2
    assert logged("best_val_rmse") not in parent.data.metrics
    assert client.search_registered_models() == []


# ---------------------------------------------------------------- parallel workers


@pytest.mark.slow
def test_two_workers_share_a_journal_study(tmp_path, real_data_dir, mlflow_store_at, capfd):
    """...and split the command's torch threads between them, as `rul evaluate --jobs` does
    (two workers with all of a 2-core machine's threads each ran 3.7x slower), each saying
    what rul says and not Optuna's log lines."""
    config = make_config(tmp_path, real_data_dir, register=False)
    journal, name = f"{tmp_path}/optuna.journal", "tune-workers"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with mlflow_store_at(tmp_path):
            summary = run_study(config, n_trials=2, workers=2, storage=journal,
                                study_name=name)
    finally:
        torch.set_num_threads(threads)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.trials
    assert len(trials) >= 2
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert summary.startswith(f"study {name}: {len(trials)} trials ")
    said = capfd.readouterr().err
    assert "trial 0 (" in said and "Using an existing study" not in said

    client = MlflowClient(tracking_uri=config.train.tracking_uri)
    parent_run_id = study.user_attrs["mlflow_parent_run_id"]
    assert [p.info.run_id for p in parents_of(study_runs(client, name))] == [parent_run_id]
    children = child_runs_by_trial(client, parent_run_id)
    assert sorted(children) == [t.number for t in trials]
    for trial in trials:
        run = children[trial.number]
        assert run.info.run_id == trial.user_attrs["mlflow_run_id"]
        assert run.info.status == "FINISHED"
        assert run.data.tags["optuna.trial_state"] == trial.state.name
        assert run.data.tags["torch_threads"] == "1"
    parent = client.get_run(parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["trials_complete"] == sum(
        t.state == TrialState.COMPLETE for t in trials)


def test_sqlite_storage_refuses_several_workers(tmp_path, real_data_dir, mlflow_store_at):
    config = make_config(tmp_path, real_data_dir)
    with mlflow_store_at(tmp_path):
        with pytest.raises(ValueError, match="journal"):
            run_study(config, n_trials=2, workers=2, storage=f"sqlite:///{tmp_path}/optuna.db")
        client = MlflowClient(tracking_uri=config.train.tracking_uri)
        experiment = client.get_experiment_by_name(MODEL_NAME)
        assert experiment is None or client.search_runs([experiment.experiment_id]) == []
    assert not (tmp_path / "optuna.db").exists()  # refused before any run or study


def test_a_config_without_search_space_is_refused(tmp_path, monkeypatch, real_data_dir):
    monkeypatch.chdir(tmp_path)
    config = make_config(tmp_path, real_data_dir, search_space={})
    with pytest.raises(ValueError, match="search_space"):
        run_study(config, n_trials=1, storage=f"sqlite:///{tmp_path}/optuna.db")
    assert list(tmp_path.iterdir()) == []  # refused before touching any store


def test_open_storage_picks_the_backend(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    assert open_storage(url, 1) == url
    for path in (f"{tmp_path}/a.journal", f"journal:{tmp_path}/b.log"):
        assert isinstance(open_storage(path, 2), optuna.storages.JournalStorage)
    assert (tmp_path / "a.journal").exists() and (tmp_path / "b.log").exists()
    assert open_storage("postgresql://host/db", 4) == "postgresql+psycopg2://host/db"
    with pytest.raises(ValueError, match="journal"):
        open_storage(url, 3)


def test_make_pruner_follows_the_config():
    base = cfg.load_tuning(TUNE_PATH, {**PLAIN, "epochs": 9, "pruner_warmup_epochs": 2})
    assert isinstance(make_pruner(base), optuna.pruners.MedianPruner)
    assert isinstance(make_pruner(base.replace(pruner="hyperband")),
                      optuna.pruners.HyperbandPruner)
    assert isinstance(make_pruner(base.replace(pruner="none")), optuna.pruners.NopPruner)


# ---------------------------------------------------------------- search space


def test_suggest_draws_each_kind_within_bounds():
    space = {"micro_batch_size": {"type": "categorical", "choices": [32, 64]},
             "num_layers": {"type": "int", "low": 2, "high": 5},
             "hidden_size": {"type": "int", "low": 16, "high": 256, "log": True},
             "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
             "dropout": {"type": "float", "low": 0.0, "high": 0.5}}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = suggest(trial, space)
        assert values == trial.params
        assert values["micro_batch_size"] in (32, 64)
        assert isinstance(values["num_layers"], int) and 2 <= values["num_layers"] <= 5
        assert isinstance(values["hidden_size"], int) and 16 <= values["hidden_size"] <= 256
        assert isinstance(values["lr"], float) and 1e-4 <= values["lr"] <= 1e-2
        assert 0.0 <= values["dropout"] <= 0.5
        study.tell(trial, 0.0)
    dists = study.trials[0].distributions
    assert dists["hidden_size"].log and dists["lr"].log and not dists["dropout"].log


def test_trial_overrides_scale_lr_with_the_effective_batch():
    base = cfg.load_tuning(TUNE_PATH, {**PLAIN, "scale_lr_with_batch": True, "lr": 1e-3,
                                "micro_batch_size": 256, "accumulation_steps": 2})
    values = {"micro_batch_size": 256, "accumulation_steps": 4, "lr": 2e-3}
    changes, reason = trial_overrides(base, values)
    assert reason is None
    assert REFERENCE_BATCH == 512
    assert changes["lr"] == pytest.approx(2e-3 * 256 * 4 / 512)  # 4e-3
    assert changes["micro_batch_size"] == 256 and changes["accumulation_steps"] == 4
    assert values["lr"] == 2e-3  # the trial's own values are not modified
    # keys outside the space come from the base config: lr 1e-3, K 2
    changes, reason = trial_overrides(base, {"micro_batch_size": 64})
    assert reason is None and changes["lr"] == pytest.approx(1e-3 * 64 * 2 / 512)
    # without the rule the values pass through unchanged
    plain = base.replace(scale_lr_with_batch=False)
    assert trial_overrides(plain, values) == (values, None)


def test_trial_overrides_refuse_batches_over_the_limit():
    base = cfg.load_tuning(TUNE_PATH, PLAIN)  # max_effective_batch 2048, K 2
    assert base.max_effective_batch == 2048
    changes, reason = trial_overrides(base, {"micro_batch_size": 512, "accumulation_steps": 8})
    assert reason == "effective batch 512x8=4096 > max 2048"
    assert trial_overrides(base, {"micro_batch_size": 512, "accumulation_steps": 4})[1] is None
    _, reason = trial_overrides(base, {"micro_batch_size": 2048})  # x base K=2
    assert reason == "effective batch 2048x2=4096 > max 2048"
    unlimited = base.replace(max_effective_batch=None)
    assert trial_overrides(unlimited, {"micro_batch_size": 2048, "accumulation_steps": 8})[1] \
        is None


def test_trial_overrides_check_transformer_heads():
    base = cfg.load_tuning(TUNE_PATH, {**PLAIN, "model": "transformer", "hidden_size": 64,
                                       "num_heads": 4})
    _, reason = trial_overrides(base, {"hidden_size": 50})
    assert reason == "hidden_size=50: must be divisible by num_heads=4"
    _, reason = trial_overrides(base, {"num_heads": 3})
    assert reason == "hidden_size=64: must be divisible by num_heads=3"
    assert trial_overrides(base, {"hidden_size": 96, "num_heads": 8})[1] is None
    assert trial_overrides(base, {"model": "cnn", "hidden_size": 50})[1] is None  # its kind's rule
    cnn = cfg.load_tuning(TUNE_PATH, PLAIN)  # heads are ignored for other models...
    assert trial_overrides(cnn, {"hidden_size": 50})[1] is None
    _, reason = trial_overrides(cnn, {"model": "transformer", "hidden_size": 50})  # ...unless
    assert reason == "hidden_size=50: must be divisible by num_heads=4"


# ---------------------------------------------------------------- the effective batch is searched


def test_trial_overrides_derive_the_split_from_the_effective_batch():
    base = cfg.load_tuning(TUNE_PATH, {**PLAIN, "scale_lr_with_batch": True})  # max 2048
    changes, reason = trial_overrides(base, {"effective_batch_size": 1024, "lr": 1e-3})
    assert reason is None
    assert changes["micro_batch_size"] == "auto"  # measured per trial, never drawn
    assert changes["lr"] == pytest.approx(1e-3 * 1024 / REFERENCE_BATCH)
    trial = base.train.replace(**changes)
    assert trial.effective_batch_size == 1024 and trial.micro_batch_size == "auto"
    _, reason = trial_overrides(base.replace(max_effective_batch=512),
                                {"effective_batch_size": 1024})
    assert reason == "effective batch 1024 > max 512"


def test_a_search_space_with_micro_batch_size_or_k_warns_why():
    with pytest.warns(UserWarning, match=r"search_space lists micro_batch_size, "
                      r"accumulation_steps: with exact accumulation .* Search "
                      r"effective_batch_size instead"):
        cfg.load_tuning(None, {"search_space": SPACE})
    with pytest.raises(cfg.ConfigError, match=r"search_space.effective_batch_size: choice 0: "
                       r"must be a positive integer or null"):
        cfg.load_tuning(None, {"search_space": {
            "effective_batch_size": {"type": "categorical", "choices": [0, 512]}}})


@pytest.mark.slow
def test_trials_search_the_effective_batch_and_log_their_measured_split(
        tmp_path, real_data_dir, mlflow_store_at):
    space = {"effective_batch_size": {"type": "categorical", "choices": [512, 1024]},
             "lr": {"type": "float", "low": 1e-3, "high": 3e-3}}
    with mlflow_store_at(tmp_path):
        config = make_config(tmp_path, real_data_dir, epochs=1, search_space=space,
                             register=False, memory_budget="64GiB")
        run_study(config, n_trials=2, storage=f"sqlite:///{tmp_path}/optuna.db",
                  study_name="tune-batch")
        study = optuna.load_study(study_name="tune-batch",
                                  storage=f"sqlite:///{tmp_path}/optuna.db")
        client = MlflowClient(tracking_uri=config.train.tracking_uri)
        children = child_runs_by_trial(client, study.user_attrs["mlflow_parent_run_id"])
        for trial in study.trials:
            assert trial.state == TrialState.COMPLETE
            assert set(trial.params) == {"effective_batch_size", "lr"}
            run = children[trial.number]
            b = trial.params["effective_batch_size"]
            params = run.data.params
            # a budget far above the peak: one micro-batch of B
            assert (params["micro_batch_size"], params["accumulation_steps"],
                    params["effective_batch_size"]) == (str(b), "1", str(b))
            assert run.data.tags["memory.auto"] == "true"
            assert run.data.tags["memory.budget_bytes"] == str(64 * 2**30)
            assert float(run.data.params["memory.chosen_peak_mb"]) > 0
            saved = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/memory_probe.json")
            table = pd.DataFrame(saved["data"], columns=saved["columns"])
            assert list(table["micro_batch_size"]) == sorted(
                m for m in (b, b // 2, b // 4, b // 8, b // 16, b // 32, b // 64, b // 128)
                if m >= 8)
            assert (table["peak_bytes"] > 0).all()


def test_the_results_page_reads_every_trial_of_a_study_as_optuna_kept_it(pruning):
    """`rul report`'s Studies section reads a study from the store: each trial that trained is
    a row with Optuna's state, value (a complete trial's objective, a pruned one's last
    report), epochs and sampled values; the trial pruned before it trained has no run, and
    is still counted."""
    from rul.reporting.pages import study_section
    from rul.reporting.studies import read_studies

    (study,) = read_studies(pruning.client)
    assert study.name == "tune-pruning" and study.extra["run_id"] == pruning.parent_run_id
    trained = [t for t in pruning.trials if "mlflow_run_id" in t.user_attrs]
    assert [row.number for row in study.trials] == [t.number for t in trained]
    for row, trial in zip(study.trials, trained, strict=True):
        assert row.state == trial.state.name
        assert row.value == pytest.approx(trial.value, rel=1e-12)
        assert row.epochs_run == max(trial.intermediate_values)
        assert row.params == trial.params
        assert row.reason == trial.user_attrs.get("reason", "")
    states = [t.state.name for t in pruning.trials]
    assert study.counts() == {s: states.count(s) for s in ("COMPLETE", "PRUNED")}
    best = min((t for t in pruning.trials if t.state == TrialState.COMPLETE),
               key=lambda t: t.value)
    assert study.best.number == best.number
    lines = study_section(study)
    assert f"{len(pruning.trials)} trials (" in lines[2]
    assert "1 never trained (pruned before running), so have no row." in lines[2]
    first_row = next(line for line in lines if line.startswith("| **"))
    assert first_row.startswith(f"| **{best.number}** | complete | {best.value:.2f} | 3 |")

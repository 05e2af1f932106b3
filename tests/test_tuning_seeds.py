"""A study whose trials are scored on several seeds (`seeds_per_trial`): each trial trains one
run per seed (seed, seed + 1, ..., each its own validation split), its value is their mean,
and the pruner reads the first seed only. One real study of tiny trials on FD001: two equal
trials that complete, then a hopeless one that is pruned on its first seed.
"""

import statistics
import warnings
from types import SimpleNamespace

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState
from test_tuning import MODEL_NAME, PLAIN, SPACE, TUNE_PATH, make_config, per_epoch

from rul import config as cfg
from rul.reporting import studies as studies_mod
from rul.reporting.pages import study_section
from rul.reporting.studies import read_studies, to_record
from rul.tracking import study_runs
from rul.tracking.metric_names import read
from rul.tracking.registry import CHAMPION
from rul.tuning import objectives as objs
from rul.tuning.study import BASE_ATTR, load_study
from rul.workflows import tune as tune_mod
from rul.workflows.tune import run_study

SEEDS = 2
STUDY = "tune-seeds"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, real_data_dir, mlflow_store_at):
    root = tmp_path_factory.mktemp("tune-seeds")
    with mlflow_store_at(root):
        space = {**SPACE, "lr": {"type": "categorical", "choices": [3e-3, 1e-7]}}
        config = make_config(root, real_data_dir, pruner="median", pruner_warmup_epochs=0,
                             search_space=space, seeds_per_trial=SEEDS)
        storage = f"sqlite:///{root}/optuna.db"
        study = load_study(config, storage, STUDY)
        good = {"micro_batch_size": 2048, "accumulation_steps": 1, "lr": 3e-3}
        for params in (good, good, {**good, "lr": 1e-7}):
            study.enqueue_trial(params)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = run_study(config, n_trials=3, storage=storage, study_name=STUDY)
        study = optuna.load_study(study_name=STUDY, storage=storage)
        client = MlflowClient(tracking_uri=config.train.tracking_uri)
        parent_run_id = study.user_attrs["mlflow_parent_run_id"]
        children = client.search_runs(
            [client.get_experiment_by_name(MODEL_NAME).experiment_id],
            f"tags.`mlflow.parentRunId` = '{parent_run_id}'", max_results=100)
        runs = {}
        for run in children:
            runs.setdefault(int(run.data.tags["optuna.trial"]), []).append(run)
        for group in runs.values():
            group.sort(key=lambda r: int(r.data.tags["optuna.seed_index"]))
        yield SimpleNamespace(summary=summary, trials=study.get_trials(deepcopy=True),
                              warnings=[str(w.message) for w in caught],
                              client=client, parent_run_id=parent_run_id, runs=runs)


def best_rmse(run) -> float:
    return read(run.data.metrics, "best_val_rmse")


def test_a_complete_trial_trains_a_run_per_seed_and_is_valued_at_their_mean(seeded):
    trial = seeded.trials[0]
    assert trial.state == TrialState.COMPLETE
    first, second = seeded.runs[trial.number]
    assert [r.data.params["seed"] for r in (first, second)] == ["42", "43"]
    assert [r.info.run_name for r in (first, second)] == ["trial-000", "trial-000-s43"]
    assert [r.data.tags["optuna.seed_index"] for r in (first, second)] == ["0", "1"]
    values = [best_rmse(first), best_rmse(second)]
    assert values[0] != values[1]  # two splits, two numbers
    assert trial.value == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert trial.user_attrs["seed_val_rmse"] == pytest.approx(values, rel=1e-12)
    assert trial.user_attrs["mlflow_run_id"] == first.info.run_id
    assert trial.user_attrs["mlflow_seed_run_ids"] == [second.info.run_id]
    for run in (first, second):
        assert run.info.status == "FINISHED"
        assert run.data.tags["optuna.trial_state"] == "COMPLETE"
        assert run.data.tags["mlflow.parentRunId"] == seeded.parent_run_id


def test_the_pruner_reads_the_first_seed_only(seeded):
    good, bad = seeded.trials[:2], seeded.trials[2]
    # a second seed reporting its epochs again would be ignored by Optuna, with a warning
    assert not [w for w in seeded.warnings if "already reported" in w]
    for trial in good:  # the first seed's epochs, not overwritten by the second's
        first = seeded.runs[trial.number][0]
        assert trial.intermediate_values == pytest.approx(
            per_epoch(seeded.client, first.info.run_id, "val/rmse"), rel=1e-12)
    assert bad.state == TrialState.PRUNED
    assert sorted(bad.intermediate_values) == [1]
    (run,) = seeded.runs[bad.number]  # pruned on its first seed: the second never trained
    assert run.data.tags["optuna.trial_state"] == "PRUNED"
    assert "mlflow_seed_run_ids" not in bad.user_attrs


def test_the_registered_model_is_the_best_trials_first_seed(seeded):
    best = min(seeded.trials[:2], key=lambda t: (t.value, t.number))
    champion = seeded.client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    first = seeded.runs[best.number][0]
    assert champion.run_id == first.info.run_id
    # it competes with its own split's RMSE, not the trial's mean over two splits
    assert float(champion.tags["val_rmse"]) == best_rmse(first) != best.value
    values = " / ".join(f"{v:.3f}" for v in best.user_attrs["seed_val_rmse"])
    assert f"val_rmse {best.value:.3f} (mean of 2 seeds: {values})" in seeded.summary


def test_the_results_page_shows_each_trial_as_the_mean_of_its_seeds(seeded):
    (study,) = read_studies(seeded.client)
    assert study.seeds_per_trial == SEEDS
    assert [row.value for row in study.trials] == pytest.approx(
        [t.value for t in seeded.trials], rel=1e-12)
    assert to_record(study)["seeds_per_trial"] == SEEDS
    assert "Each trial trained 2 seeds, each its own validation split" in study_section(study)[2]


def test_a_trials_objectives_over_seeds_are_means_and_the_largest_peak():
    states = [SimpleNamespace(best_val_rmse=b, history=[{"samples_per_s": s,
                                                          "peak_memory_mb": m}])
              for b, s, m in ((10.0, 100.0, 5.0), (12.0, 300.0, 7.0))]
    assert objs.over_seeds(["val_rmse", "samples_per_s", "peak_memory_mb"], states) == [
        11.0, 200.0, 7.0]
    assert objs.over_seeds(["val_rmse"], states[:1]) == [10.0]
    # val_rmse alone reads nothing else a run may not have measured
    assert objs.over_seeds(["val_rmse"], [SimpleNamespace(best_val_rmse=9.0, history=[])]) == [
        9.0]


def test_a_study_from_before_seeds_per_trial_trained_one_seed():
    """Its stored base config has no seeds_per_trial: resuming it with 3 would put means of
    three splits beside values of one under one best."""
    config = cfg.load_tuning(TUNE_PATH, {**PLAIN, "search_space": SPACE})
    storage = optuna.storages.InMemoryStorage()
    load_study(config, storage, "s")
    study = optuna.load_study(study_name="s", storage=storage)
    study.ask()
    stored = dict(study.user_attrs[BASE_ATTR])
    del stored["seeds_per_trial"]
    study.set_user_attr(BASE_ATTR, stored)
    load_study(config, storage, "s")  # one seed: as it trained
    with pytest.raises(cfg.ConfigError, match="trained with seeds_per_trial=1; this config has "
                                              "seeds_per_trial=3"):
        load_study(config.replace(seeds_per_trial=3), storage, "s")


class FakeTrial:
    def __init__(self, user_attrs):
        self.number, self.user_attrs = 4, dict(user_attrs)
        self.study = SimpleNamespace(study_name="s")

    def set_user_attr(self, key, value):
        self.user_attrs[key] = value


def test_a_retried_trial_lists_its_own_seed_runs_not_the_dead_ones():
    """Optuna's retry of a dead worker's trial copies its user attributes."""
    trial = FakeTrial({"mlflow_run_id": "dead0", "mlflow_seed_run_ids": ["dead1"]})
    plan = SimpleNamespace(config=SimpleNamespace(seed=42))
    for index in range(2):
        role = tune_mod._trial_role(trial, "parent", index, 2, plan)
        role.on_run_created(f"new{index}")
    assert study_runs.trial_run_ids(trial.user_attrs) == ["new0", "new1"]
    single = FakeTrial({})
    tune_mod._trial_role(single, "parent", 0, 1, plan).on_run_created("only")
    assert single.user_attrs == {"mlflow_run_id": "only"}  # one seed: nothing new


def test_a_killed_trials_runs_all_say_fail_and_the_running_one_ends_killed():
    tagged, ended = [], []
    client = SimpleNamespace(
        set_tag=lambda run, key, value: tagged.append((run, key, value)),
        get_run=lambda run: SimpleNamespace(info=SimpleNamespace(
            status="RUNNING" if run == "s43" else "FINISHED")),
        set_terminated=lambda run, status: ended.append((run, status)))
    study_runs.end_failed_trial_runs(
        client, {"mlflow_run_id": "s42", "mlflow_seed_run_ids": ["s43"]}, "killed")
    assert tagged == [(run, key, value) for run in ("s42", "s43")
                      for key, value in (("optuna.trial_state", "FAIL"),
                                         ("optuna.reason", "killed"))]
    assert ended == [("s43", "KILLED")]


def test_a_trial_training_a_later_seed_reads_as_running():
    def run(status, seed_index, **metrics):
        return SimpleNamespace(info=SimpleNamespace(status=status), data=SimpleNamespace(
            tags={"optuna.trial": "2", "optuna.seed_index": str(seed_index)},
            metrics=metrics, params={}))

    first = run("FINISHED", 0, **{"val/best_rmse": 10.5, "val/rmse": 10.6, "epoch": 50.0})
    (runs,) = studies_mod._by_trial([run("RUNNING", 1), first])
    assert runs[0] is first
    row = studies_mod._trial(runs, {})
    assert (row.number, row.state, row.value, row.epochs_run) == (2, "RUNNING", 10.6, 50)

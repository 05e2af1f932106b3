"""`baseline_trial`: a study whose first trial trains the base config's own values of the
searched keys (the recipe in place), scored like the draws. One real study of tiny trials on
FD001, then resumed: the baseline trains once.
"""

import contextlib
import io
from types import SimpleNamespace

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from test_tuning import MODEL_NAME, make_config

from rul import config as cfg
from rul.reporting.pages import study_section
from rul.reporting.studies import read_recorded_studies, read_studies, to_record
from rul.tracking import study_runs
from rul.tuning.study import load_study
from rul.workflows import tune as tune_mod
from rul.workflows.tune import run_study

STUDY = "tune-baseline"
BASE = {"micro_batch_size": 2048, "accumulation_steps": 1, "lr": 1e-3, "dropout": 0.1}
SPACE = {"lr": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
         "dropout": {"type": "categorical", "choices": [0.1, 0.3]}}


def baseline_config(root, data_dir, **changes) -> cfg.TuningConfig:
    return make_config(root, data_dir, **BASE, search_space=SPACE, baseline_trial=True,
                       pruner="none", **changes)


@pytest.fixture(scope="module")
def studied(tmp_path_factory, real_data_dir, mlflow_store_at):
    root = tmp_path_factory.mktemp("tune-baseline")
    with mlflow_store_at(root):
        config = baseline_config(root, real_data_dir, epochs=1)
        storage = f"sqlite:///{root}/optuna.db"
        said = io.StringIO()
        with contextlib.redirect_stderr(said):  # the trials' start lines
            run_study(config, n_trials=2, storage=storage, study_name=STUDY)
            run_study(config, n_trials=1, storage=storage, study_name=STUDY)  # resumed
        study = optuna.load_study(study_name=STUDY, storage=storage)
        client = MlflowClient(tracking_uri=config.train.tracking_uri)
        runs = client.search_runs(
            [client.get_experiment_by_name(MODEL_NAME).experiment_id],
            f"tags.`{study_runs.STUDY}` = '{STUDY}' and tags.`{study_runs.TRIAL}` != ''")
        yield SimpleNamespace(trials=study.get_trials(deepcopy=True),
                              runs={int(r.data.tags[study_runs.TRIAL]): r for r in runs},
                              client=client, said=said.getvalue())


def test_the_first_trial_trains_the_base_values_and_only_it_is_marked(studied):
    assert [t.state for t in studied.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    first, *drawn = studied.trials
    assert first.params == {"lr": 1e-3, "dropout": 0.1}
    assert first.user_attrs[study_runs.BASELINE_ATTR] is True
    assert all(study_runs.BASELINE_ATTR not in t.user_attrs for t in drawn)
    assert all(t.params["lr"] != 1e-3 for t in drawn)  # drawn, not the base's
    run = studied.runs[0]
    assert (run.data.params["lr"], run.data.params["dropout"]) == ("0.001", "0.1")
    assert run.data.tags[study_runs.BASELINE] == "true"
    assert [study_runs.BASELINE in studied.runs[n].data.tags for n in (1, 2)] == [False, False]


def test_a_resumed_study_does_not_train_the_baseline_again(studied):
    assert len(studied.trials) == 3  # 2, then 1 drawn: no second baseline, waiting or trained
    assert sum(bool(t.user_attrs.get(study_runs.BASELINE_ATTR)) for t in studied.trials) == 1


def test_the_results_page_and_the_record_mark_the_baseline(studied, tmp_path):
    study = next(s for s in read_studies(studied.client) if s.name == STUDY)
    assert [t.baseline for t in study.trials] == [True, False, False]
    section = "\n".join(study_section(study))
    assert "Trial 0 (base) trained the base config's own values" in section
    assert sum("| 0 (base) |" in line or "| **0** (base) |" in line
               for line in section.splitlines()) == 1
    record = to_record(study)
    assert record["trials"][0]["baseline"] is True
    assert "baseline" not in record["trials"][1]
    path = tmp_path / "studies.yaml"
    path.write_text(yaml.safe_dump({"studies": [record]}))
    assert [t.baseline for t in read_recorded_studies(path)[0].trials] == [True, False, False]


def test_the_start_line_says_the_values_are_the_base_configs(studied):
    starts = [line for line in studied.said.splitlines() if line.startswith("trial ")
              and ": lr=" in line]
    assert starts[0] == "trial 0 (1 of 2): lr=0.001 dropout=0.1 (the base config's)"
    assert len(starts) == 3 and not any("base" in line for line in starts[1:])


def test_a_baseline_killed_while_running_is_trained_again(tmp_path, real_data_dir,
                                                          mlflow_store_at):
    """An earlier invocation killed during the baseline left it RUNNING; resuming fails it
    (as any interrupted trial) and trains the baseline again, not a draw in its place."""
    with mlflow_store_at(tmp_path):
        config = baseline_config(tmp_path, real_data_dir, epochs=1)
        storage = f"sqlite:///{tmp_path}/optuna.db"
        study = load_study(config, storage, STUDY)
        study.enqueue_trial(config.baseline_params(),
                            user_attrs={study_runs.BASELINE_ATTR: True})
        study.ask()  # the baseline, RUNNING: its process is gone
        run_study(config, n_trials=1, storage=storage, study_name=STUDY)
        trials = optuna.load_study(study_name=STUDY, storage=storage).trials
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].params == {"lr": 1e-3, "dropout": 0.1}
    assert trials[1].user_attrs[study_runs.BASELINE_ATTR] is True


@pytest.mark.parametrize("state, again", [("COMPLETE", False), ("PRUNED", False),
                                          ("WAITING", False), ("FAIL", True)])
def test_the_baseline_is_enqueued_unless_one_trained_or_waits(tmp_path, real_data_dir, state,
                                                               again):
    config = baseline_config(tmp_path, real_data_dir)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/optuna.db")
    study.enqueue_trial(config.baseline_params(), user_attrs={study_runs.BASELINE_ATTR: True})
    if state != "WAITING":
        trial = study.ask()
        trial.suggest_float("lr", 1e-4, 3e-3, log=True)
        study.tell(trial, 1.0 if state == "COMPLETE" else None,
                   state=getattr(optuna.trial.TrialState, state))
    tune_mod._enqueue_baseline(study, config)
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == (1 if again or state == "WAITING" else 0)
    assert all(t.user_attrs[study_runs.BASELINE_ATTR] for t in waiting)


LR = {"lr": {"type": "float", "low": 1e-4, "high": 3e-3}}


@pytest.mark.parametrize("changes, said", [
    ({"search_space": {"lr": {"type": "float", "low": 2e-3, "high": 3e-3}}},
     "search_space.lr: the base lr=0.001 is not a number within low=0.002..high=0.003, so "
     "baseline_trial cannot train it"),
    ({"search_space": {"dropout": {"type": "categorical", "choices": [0.2, 0.3]}}},
     r"search_space.dropout: the base dropout=0.1 is not among its choices \[0.2, 0.3\]"),
    ({"max_grad_norm": None, "search_space": {
        "max_grad_norm": {"type": "float", "low": 0.5, "high": 2.0}}},
     "search_space.max_grad_norm: the base max_grad_norm=null is not a number within"),
    ({"weight_decay": 0.05, "search_space": {
        "weight_decay": {"type": "int", "low": 0, "high": 1}}},
     "search_space.weight_decay: the base weight_decay=0.05 is not an integer within"),
    ({"scale_lr_with_batch": True, "search_space": LR},
     "baseline_trial=true: with scale_lr_with_batch the baseline would train lr x "
     "effective_batch / 512, not the base config's lr"),
    ({"max_effective_batch": 1024, "search_space": {
        **LR, "effective_batch_size": {"type": "categorical", "choices": [512, 1024]}}},
     "baseline_trial=true: the base effective batch 2048 is over max_effective_batch=1024"),
])
def test_a_baseline_that_would_not_train_the_base_config_is_refused_in_one_line(
        tmp_path, real_data_dir, changes, said):
    with pytest.raises(cfg.ConfigError, match=said) as error:
        make_config(tmp_path, real_data_dir, **{**BASE, **changes}, baseline_trial=True)
    assert "\n" not in str(error.value)
    make_config(tmp_path, real_data_dir, **{**BASE, **changes})  # without it: fine

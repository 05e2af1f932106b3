"""Multi-objective tuning (`objectives`) and the study's Optuna figures on its parent run.

One real 2-objective study (3 tiny trials on FD001, val_rmse and samples_per_s) is shared by
the end-to-end tests; the objective rules, the figures and the Pareto table's pieces are also
tested on small in-memory Optuna studies that train nothing.
"""

import contextlib
import io
import resource
import statistics
from pathlib import Path
from types import SimpleNamespace

import mlflow
import optuna
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from optuna.study import StudyDirection
from optuna.trial import TrialState
from test_tuning import (  # the tiny tuning config
    MODEL_NAME,
    PLAIN,
    PLAIN_ARGS,
    TUNE_PATH,
    make_config,
)

from rul import config as cfg
from rul.cli import main
from rul.tracking.metric_names import logged
from rul.tracking.registry import CHAMPION
from rul.training.engine import TrainState
from rul.tuning import objectives as objs
from rul.tuning.report import PARETO_FILE, format_pareto_table, log_figures
from rul.tuning.study import load_study, make_pruner
from rul.workflows.tune import run_study

TWO = ["val_rmse", "samples_per_s"]
STUDY = "tune-pareto"


def download(run_id: str, path: str, tracking_uri: str, dst: Path) -> Path:
    return Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path,
                                                    dst_path=str(dst), tracking_uri=tracking_uri))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("objectives,problem", [
    ([], "must list at least one objective (val_rmse, samples_per_s, peak_memory_mb)"),
    (["val_rmse", "val_rmse"], "lists 'val_rmse' twice"),
    (["val_rmse", "samples_per_second"], "unknown objective 'samples_per_second' (did you mean "
                                         "'samples_per_s'?); known: val_rmse, samples_per_s, "
                                         "peak_memory_mb"),
    (["samples_per_s", "peak_memory_mb"], "must include val_rmse (the registered model is the "
                                          "trial with the best val_rmse)"),
    ("val_rmse", "must be a non-empty list of objective names: val_rmse, samples_per_s, "
                 "peak_memory_mb"),
])
def test_bad_objective_lists_are_config_errors_naming_the_key(objectives, problem):
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load_tuning(TUNE_PATH, {**PLAIN, "objectives": objectives})
    assert str(error.value) == f"overrides: objectives={objectives!r}: {problem}"


def test_objectives_default_to_val_rmse_and_set_directions():
    assert cfg.load_tuning(TUNE_PATH, PLAIN).objectives == ["val_rmse"]
    three = cfg.load_tuning(TUNE_PATH, [*PLAIN_ARGS,
                                        "objectives=[peak_memory_mb, val_rmse, samples_per_s]"])
    assert objs.directions(three.objectives) == ["minimize", "minimize", "maximize"]
    assert isinstance(make_pruner(three), optuna.pruners.NopPruner)  # median asked, none used
    assert isinstance(make_pruner(cfg.load_tuning(TUNE_PATH, PLAIN)), optuna.pruners.MedianPruner)


def test_cli_refuses_a_bad_objective_with_exit_code_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["tune", str(TUNE_PATH), "objectives=[val_rmse, speed]"])
    assert result.exit_code == 2, result.output
    assert "objectives=['val_rmse', 'speed']: unknown objective 'speed'" in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option, value, said", [
    ("--n-trials", "0", "Invalid value for '--n-trials': 0 is not in the range x>=1."),
    ("--n-trials", "-3", "Invalid value for '--n-trials': -3 is not in the range x>=1."),
    ("--workers", "0", "Invalid value for '--workers': 0 is not in the range x>=1."),
    ("--timeout", "-1", "Invalid value for '--timeout': -1.0 is not a number of seconds > 0"),
    ("--timeout", "nan", "Invalid value for '--timeout': nan is not a number of seconds > 0"),
])
def test_cli_refuses_a_study_that_could_run_no_trial(tmp_path, monkeypatch, option, value,
                                                     said):
    """Before, 0 trials or workers ran nothing and exited 0, leaving a store and a study."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["tune", str(TUNE_PATH), option, value])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- values and the chosen trial


def test_trial_values_come_from_the_epoch_history():
    state = TrainState()
    state.best_val_rmse = 17.5
    state.history = [{"samples_per_s": s, "peak_memory_mb": m, "val_rmse": 20.0}
                     for s, m in ((100.0, 300.0), (900.0, 350.0), (1000.0, 320.0))]
    assert objs.trial_values(["val_rmse", "samples_per_s", "peak_memory_mb"], state) == [
        17.5, 900.0, 350.0]  # best RMSE, median throughput (warm-up ignored), largest peak
    assert objs.trial_values(["peak_memory_mb", "val_rmse"], state) == [350.0, 17.5]


def _study(directions, trials) -> optuna.Study:
    """An in-memory study of finished trials: (params, values) pairs."""
    study = optuna.create_study(directions=directions)
    distributions = {"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
                     "hidden_size": optuna.distributions.CategoricalDistribution([16, 32])}
    for params, values in trials:
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions,
                                                  values=values))
    return study


def test_the_registered_trial_is_the_pareto_trial_with_the_lowest_val_rmse():
    # (val_rmse, samples/s): 0 and 2 are on the front, 1 is dominated by 0; 3 ties 0 on RMSE
    study = _study(["minimize", "maximize"], [
        ({"lr": 1e-3, "hidden_size": 16}, [20.0, 500.0]),
        ({"lr": 2e-3, "hidden_size": 32}, [21.0, 400.0]),
        ({"lr": 3e-3, "hidden_size": 16}, [25.0, 900.0]),
        ({"lr": 4e-3, "hidden_size": 32}, [20.0, 500.0]),
    ])
    assert sorted(t.number for t in study.best_trials) == [0, 2, 3]
    assert objs.best_accuracy_trial(study, TWO).number == 0  # tie: the earlier trial
    # val_rmse need not come first
    swapped = _study(["maximize", "minimize"], [({"lr": 1e-3, "hidden_size": 16}, [900.0, 25.0]),
                                                ({"lr": 2e-3, "hidden_size": 32}, [500.0, 19.0])])
    assert objs.best_accuracy_trial(swapped, ["samples_per_s", "val_rmse"]).number == 1


def test_peak_memory_is_reset_for_each_trial():
    def peak_mib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    block = bytearray(400 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    high = peak_mib()
    del block
    objs.reset_peak_memory()
    assert peak_mib() < high - 300  # the freed block no longer counts


# ---------------------------------------------------------------- figures (in-memory studies)


def test_single_objective_figures_and_a_skipped_one(mlflow_store):
    one = _study(["minimize"], [({"lr": 1e-3, "hidden_size": 16}, [20.0])])
    stderr = io.StringIO()
    with mlflow.start_run() as run, contextlib.redirect_stderr(stderr):
        log_figures(one, ["val_rmse"])  # one trial: no importances, no failure
    client = MlflowClient()
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert figures == {"figures/optimization_history.png"}
    tags = client.get_run(run.info.run_id).data.tags
    assert "figure_skipped.param_importances.png" in tags
    assert tags["figure_skipped.param_importances.png"] == (
        "parameter importances need at least 2 completed trials (have 1)")
    assert "figure param_importances.png skipped: parameter importances need" in stderr.getvalue()

    same = _study(["minimize"], [({"lr": 1e-3, "hidden_size": 16}, [v]) for v in (20.0, 21.0)])
    with mlflow.start_run() as run:
        log_figures(same, ["val_rmse"])
    assert client.get_run(run.info.run_id).data.tags["figure_skipped.param_importances.png"] \
        == "parameter importances need a parameter that varies across completed trials"

    several = _study(["minimize"], [({"lr": 10 ** -(2 + i / 3), "hidden_size": 16 << (i % 2)},
                                     [20.0 + i * i % 5]) for i in range(5)])
    with mlflow.start_run() as run:
        log_figures(several, ["val_rmse"])
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert figures == {"figures/optimization_history.png", "figures/param_importances.png"}


def test_multi_objective_figures_target_val_rmse(mlflow_store, monkeypatch):
    study = _study(["minimize", "maximize"], [
        ({"lr": 10 ** -(2 + i / 3), "hidden_size": 16 << (i % 2)}, [20.0 + i * i % 5, 100.0 * i])
        for i in range(5)])
    from optuna.visualization import matplotlib as vis

    drawn = {}
    real = vis.plot_optimization_history

    def spy(study, **options):  # what the history figure is drawn of
        drawn.update(options)
        return real(study, **options)

    monkeypatch.setattr(vis, "plot_optimization_history", spy)
    with mlflow.start_run() as run:
        log_figures(study, TWO)
    figures = {a.path for a in MlflowClient().list_artifacts(run.info.run_id, "figures")}
    assert figures == {"figures/optimization_history.png", "figures/param_importances.png",
                       "figures/pareto_front.png"}
    assert drawn["target_name"] == "val_rmse"
    assert [drawn["target"](t) for t in study.trials] == [t.values[0] for t in study.trials]


# ---------------------------------------------------------------- a real 2-objective study


@pytest.fixture(scope="module")
def pareto(tmp_path_factory, real_data_dir, mlflow_store_at):
    """3 tiny trials minimising val_rmse and maximising samples/s, median pruner asked for."""
    root = tmp_path_factory.mktemp("tune-pareto")
    with mlflow_store_at(root):
        config = make_config(root, real_data_dir, objectives=TWO, pruner="median",
                             pruner_warmup_epochs=0)
        storage = f"sqlite:///{root}/optuna.db"
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            summary = run_study(config, n_trials=3, storage=storage, study_name=STUDY)
        study = optuna.load_study(study_name=STUDY, storage=storage)
        client = MlflowClient(tracking_uri=config.train.tracking_uri)
        parent_run_id = study.user_attrs["mlflow_parent_run_id"]
        yield SimpleNamespace(
            root=root, config=config, storage=storage, summary=summary, stderr=stderr.getvalue(),
            study=study, trials=study.get_trials(deepcopy=True), client=client,
            parent_run_id=parent_run_id, parent=client.get_run(parent_run_id),
            versions=client.search_model_versions(f"name = '{MODEL_NAME}'"),
            champion=client.get_model_version_by_alias(MODEL_NAME, CHAMPION))


def test_two_objective_study_stores_two_directions_and_values(pareto):
    assert pareto.study.directions == [StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE]
    assert pareto.study.user_attrs["objectives"] == TWO
    assert [t.state for t in pareto.trials] == [TrialState.COMPLETE] * 3
    for trial in pareto.trials:
        assert len(trial.values) == 2
        assert trial.intermediate_values == {}  # pruning off: nothing reported
        run_id = trial.user_attrs["mlflow_run_id"]
        val = [m.value for m in pareto.client.get_metric_history(run_id, "val/rmse")]
        speed = [m.value for m in pareto.client.get_metric_history(run_id,
                                                              "system/samples_per_s")]
        assert trial.values[0] == pytest.approx(min(val), rel=1e-6)
        assert trial.values[1] == pytest.approx(statistics.median(speed), rel=1e-6)
    assert "pruner='median' is ignored" in pareto.stderr
    assert pareto.parent.data.params["objectives"] == "val_rmse, samples_per_s"


def test_parent_run_holds_the_pareto_front(pareto, tmp_path):
    table = pd.read_csv(download(pareto.parent_run_id, PARETO_FILE,
                                 pareto.config.train.tracking_uri, tmp_path))
    front = {t.number: t for t in pareto.study.best_trials}
    assert sorted(table["trial"]) == sorted(front)
    assert list(table["val_rmse"]) == sorted(table["val_rmse"])  # best val_rmse first
    for row in table.itertuples():
        trial = front[row.trial]
        assert [row.val_rmse, row.samples_per_s] == pytest.approx(trial.values, rel=1e-9)
        run = pareto.client.get_run(trial.user_attrs["mlflow_run_id"])
        micro, k = trial.params["micro_batch_size"], trial.params["accumulation_steps"]
        assert (row.micro_x_k, row.effective_batch) == (f"{micro}x{k}", micro * k)
        assert row.lr == pytest.approx(trial.params["lr"]) == float(run.data.params["lr"])
        assert row.mlflow_run_id == run.info.run_id
    assert pareto.parent.data.metrics["pareto_trials"] == len(front)
    figures = {a.path for a in pareto.client.list_artifacts(pareto.parent_run_id, "figures")}
    assert {"figures/pareto_front.png", "figures/optimization_history.png",
            "figures/param_importances.png"} <= figures
    printed = format_pareto_table(table, TWO)
    assert printed in pareto.summary
    assert f"Pareto front (val_rmse, samples_per_s): {len(front)} trials" in pareto.summary


def test_the_best_val_rmse_pareto_trial_is_registered(pareto):
    best = min(pareto.study.best_trials, key=lambda t: (t.values[0], t.number))
    assert best.values[0] == min(t.values[0] for t in pareto.trials)
    best_run_id = best.user_attrs["mlflow_run_id"]
    assert [v.run_id for v in pareto.versions] == [best_run_id]
    assert pareto.champion.run_id == best_run_id
    assert float(pareto.champion.tags["val_rmse"]) == best.values[0]
    assert pareto.parent.data.tags["best_trial"] == str(best.number)
    assert pareto.parent.data.metrics[logged("best_val_rmse")] == pytest.approx(best.values[0],
                                                                        rel=1e-12)
    assert (f"best val_rmse on the Pareto front: trial {best.number}: "
            f"val_rmse {best.values[0]:.3f}") in pareto.summary


@pytest.mark.parametrize("objectives,stored", [
    (["val_rmse"], TWO),
    (["val_rmse", "peak_memory_mb"], TWO),  # 2 directions too, other objectives
])
def test_resuming_with_other_objectives_is_a_one_line_error(pareto, objectives, stored):
    config = pareto.config.replace(objectives=objectives)
    with pytest.raises(cfg.ConfigError) as error:
        run_study(config, n_trials=1, storage=pareto.storage, study_name=STUDY)
    assert str(error.value) == (
        f"study {STUDY!r}: objectives={objectives}: the study was created with objectives "
        f"{stored}; tune it with those, or name a new study (--study-name)")
    assert len(optuna.load_study(study_name=STUDY, storage=pareto.storage).trials) == 3


def test_a_single_objective_study_refuses_several_objectives(pareto):
    storage = f"sqlite:///{pareto.root}/single.db"
    load_study(pareto.config.replace(objectives=["val_rmse"]), storage, "single")
    with pytest.raises(cfg.ConfigError, match=r"created with objectives \['val_rmse'\]"):
        load_study(pareto.config, storage, "single")

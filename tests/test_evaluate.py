"""`rul evaluate`: N seeded trainings under one parent run, reported as mean ± std.

One tiny evaluation of 2 seeds on the real FD001 data is shared (module fixture); the
aggregates are checked against the children's own logged metrics, not against the code's.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.cli import main
from rul.evaluation import seeds as seed_aggregation
from rul.evaluation.seeds import INTERVAL_REPORTED, REPORTED, summary_table
from rul.plan import evaluation_seeds
from rul.tracking.metric_names import logged
from rul.tracking.parent_run import INDEX_TAG, KIND_TAG
from rul.training.listener import TrainingListener
from rul.workflows import evaluate as evaluate_workflow
from rul.workflows.evaluate import evaluate_seeds

ROOT = Path(__file__).resolve().parents[1]
CONFIG_PATH = ROOT / "experiments" / "fd001.yaml"
PARENT = "mlflow.parentRunId"


@pytest.fixture(scope="module")
def evaluated(fd001_store, fd001_client):
    config = fd001_store.config(seed=42)
    evaluation = evaluate_seeds(config, 2, progress=False)
    parent = fd001_client.get_run(evaluation.parent_run_id)
    children = fd001_client.search_runs([parent.info.experiment_id],
                                  f"tags.`{PARENT}` = '{parent.info.run_id}'")
    children = sorted(children, key=lambda r: int(r.data.params["seed"]))
    return SimpleNamespace(config=config, evaluation=evaluation, parent=parent,
                           children=children)


def test_one_parent_and_a_finished_child_per_seed(evaluated):
    parent, children = evaluated.parent, evaluated.children
    assert parent.info.status == "FINISHED"
    assert parent.info.run_name == "evaluate-cnn-b1024-k1-s42-x2"
    assert parent.data.tags[KIND_TAG] == "evaluate" and PARENT not in parent.data.tags
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED"]
    assert [c.data.params["seed"] for c in children] == ["42", "43"]
    assert [c.data.tags[INDEX_TAG] for c in children] == ["0", "1"]
    # each seed is a complete training: its own validation split
    assert children[0].data.tags["seed.split"] != children[1].data.tags["seed.split"]
    assert parent.data.params["seeds"] == "2"


def test_aggregates_are_mean_and_std_of_the_children(evaluated):
    metrics, children = evaluated.parent.data.metrics, evaluated.children
    for key in (*REPORTED, *INTERVAL_REPORTED):  # intervals are on by default
        child_key = logged("best_val_rmse" if key == "val_rmse" else key)
        values = np.array([c.data.metrics[child_key] for c in children])
        assert metrics[logged(f"{key}_mean")] == pytest.approx(values.mean(), rel=1e-12), key
        assert metrics[logged(f"{key}_std")] == pytest.approx(values.std(ddof=1),
                                                               rel=1e-12), key
    assert "verdict/test/rmse_mean" in metrics and "val/rmse_std" in metrics
    assert metrics["system/wall_time_s"] > 0


def test_per_seed_table_lists_each_child(evaluated, fd001_client, tmp_path):
    path = fd001_client.download_artifacts(evaluated.parent.info.run_id, "seeds.json",
                                           str(tmp_path))
    table = json.loads(Path(path).read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert [r["run_id"] for r in rows] == [c.info.run_id for c in evaluated.children]
    assert [r["test_rmse"] for r in rows] == pytest.approx(
        [c.data.metrics[logged("test_rmse")] for c in evaluated.children])


def test_nothing_is_registered(evaluated, fd001_client):
    assert fd001_client.search_registered_models() == []
    for run in (evaluated.parent, *evaluated.children):
        assert "registered_version" not in run.data.tags


def test_summary_table_shows_each_seed_and_the_mean(evaluated):
    text = summary_table(evaluated.evaluation)
    lines = text.splitlines()
    rmse = [c.data.metrics[logged("test_rmse")] for c in evaluated.children]
    assert any(line.split()[0] == "42" and f"{rmse[0]:.2f}" in line for line in lines)
    assert any(line.split()[0] == "43" and f"{rmse[1]:.2f}" in line for line in lines)
    mean = next(line for line in lines if line.split()[0] == "mean")
    assert f"{np.mean(rmse):.2f} ± {np.std(rmse, ddof=1):.2f}" in mean
    assert ", track sensors," in lines[0]  # experiments/fd001.yaml reads the sensors alone
    band = next(line for line in lines if line.startswith("interval by true RUL"))
    low = [c.data.metrics[logged("test_interval_coverage_rul_le25")] for c in evaluated.children]
    assert f"coverage {np.mean(low):.0%} / " in band
    assert evaluated.parent.data.metrics[logged("test_p_fail_brier_mean")] == pytest.approx(
        np.mean([c.data.metrics[logged("test_p_fail_brier")] for c in evaluated.children]))


def test_one_seed_has_a_mean_and_no_std():
    rows = [{k: 1.5 for k in REPORTED}]
    assert seed_aggregation.aggregate(rows) == {f"{k}_mean": 1.5 for k in REPORTED}


def test_ensemble_seeds_are_spaced_so_no_member_repeats():
    config = cfg.load(None, {"seed": 10, "ensemble": 3})
    assert evaluation_seeds(config, 3) == [10, 13, 16]
    assert evaluation_seeds(cfg.load(None, {"seed": 10}), 3) == [10, 11, 12]


def test_a_folds_ensemble_evaluates_out_of_fold(fd001_store, fd001_client):
    """Each seed of `ensemble_split: folds` is a cross-fitted ensemble of its own folds; the
    evaluation's val_rmse is the ensemble's out-of-fold RMSE, not a member's."""
    config = fd001_store.config(seed=42, ensemble=2, ensemble_split="folds", epochs=1)
    evaluation = evaluate_seeds(config, 1, progress=False)
    parent = fd001_client.get_run(evaluation.parent_run_id)
    (ensemble,) = fd001_client.search_runs([parent.info.experiment_id],
                                           f"tags.`{PARENT}` = '{parent.info.run_id}'")
    members = fd001_client.search_runs([parent.info.experiment_id],
                                       f"tags.`{PARENT}` = '{ensemble.info.run_id}'")
    assert ensemble.data.tags["ensemble.split"] == "folds"
    assert sorted(m.data.tags["ensemble.fold"] for m in members) == ["0", "1"]
    assert parent.data.metrics["val/rmse_mean"] == pytest.approx(
        ensemble.data.metrics["val/rmse"], rel=1e-12)
    assert parent.data.metrics["val/rmse_mean"] != pytest.approx(
        ensemble.data.metrics["member_val_rmse_mean"], rel=1e-6)


# ---------------------------------------------------------------- bad input, interruptions


@pytest.mark.filterwarnings("ignore:dropped")  # window=400: every unit is short
@pytest.mark.parametrize(("args", "said"), [
    (["--seeds", "0"], "0 is not in the range x>=1"),
    (["ensemble=0"], "ensemble=0: must be a positive integer"),
    (["window=400"], "window=400: longer than every"),
    (["ensemble=2", "ensemble_split=folds", "window=400"], "window=400: longer than every"),
    (["ensemble_split=folds"], "ensemble_split='folds': needs ensemble >= 2"),
])
def test_bad_input_is_one_line_exit_2_and_no_run(mlflow_store, real_data_dir, args, said):
    result = CliRunner().invoke(main, ["evaluate", str(CONFIG_PATH), *args,
                                       f"data_dir={real_data_dir}", "--no-progress"])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output
    client = MlflowClient(tracking_uri=mlflow_store.uri)
    experiment = client.get_experiment_by_name("rul-fd001")
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []


class InterruptSecondSeed(TrainingListener):
    def __init__(self, seed):
        self.seed = seed

    def on_epoch(self, epoch, step, metrics):
        if self.seed == 43:
            raise KeyboardInterrupt


def test_an_interruption_ends_parent_and_child_killed(fd001_store, fd001_client, monkeypatch):
    real = evaluate_workflow.track

    def interrupted(plan, role, store, listener=None, **kwargs):
        return real(plan, role, store, InterruptSecondSeed(plan.config.seed), **kwargs)

    monkeypatch.setattr(evaluate_workflow, "track", interrupted)
    config = fd001_store.config(seed=42, experiment="interrupted")
    with pytest.raises(KeyboardInterrupt):
        evaluate_seeds(config, 3, progress=False)
    stopped = fd001_client.get_experiment_by_name("interrupted").experiment_id
    runs = fd001_client.search_runs([stopped])
    status = {r.data.tags.get(INDEX_TAG, "parent"): r.info.status for r in runs}
    assert status == {"parent": "KILLED", "0": "FINISHED", "1": "KILLED"}  # seed 3 never ran
    assert not list((fd001_store.root / "ckpt").rglob("*.pt"))  # seeded runs are not resumable


@pytest.mark.slow
def test_sigterm_ends_evaluate_cleanly(tmp_path, real_data_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CMAPSS_DIR": str(real_data_dir)}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [sys.executable, "-m", "rul", "evaluate", str(CONFIG_PATH), "epochs=40",
            "patience=40", "filters=4", "num_layers=2", "hidden_size=16",
            "micro_batch_size=512", "accumulation_steps=1", f"checkpoint_dir={tmp_path / 'ck'}",
            "--seeds", "2", "--no-progress"]
    process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 180
    while not list((tmp_path / "ck").rglob("*.pt")):  # the first seed is training
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=180)
    assert process.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "terminated (SIGTERM)" in err
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("rul-fd001").experiment_id])
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"]  # parent, first seed

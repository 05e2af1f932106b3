"""MLflow tracking end to end, against a real SQLite store in a temporary folder.

One tiny tracked training on the real FD001 data is shared by most tests (module fixture);
the registry, failure and Ctrl-C tests add a few more short runs to the same store. Inference
and serving are tested in test_inference.py and test_serving.py.
"""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from rul import config as cfg
from rul.data import DataError
from rul.plan import cpu_measured, plan_run
from rul.tracking.metric_names import logged
from rul.tracking.registry import CHAMPION, register_and_promote
from rul.tracking.run_checkpoints import CannotResume, RunCheckpoints
from rul.tracking.store import open_store
from rul.training.listener import TrainingListener
from rul.training.precision import auto_precision
from rul.training.seeding import derive_seeds
from rul.workflows.tracked import OWN_RUN, track
from rul.workflows.train import train_tracked

MODEL_NAME = "rul-fd001"
# as logged (rul.tracking.metric_names): + train/lr with a schedule, AMP's with fp16
STEP_METRICS = ("train/loss", "train/grad_norm", "clipped")
EPOCH_METRICS = ("train/loss_epoch", "val/rmse", "system/samples_per_s",
                 "system/peak_memory_mb", "epoch")
FINAL_METRICS = ("test_rmse", "test_rmse_uncapped", "test_mae", "test_score", "best_epoch",
                 "best_val_rmse")


@pytest.fixture(scope="module")
def trained(fd001_store):
    """The shared tracked training: (config, outcome, run_id)."""
    config = fd001_store.config()
    outcome, run_id = train_tracked(config, progress=False)
    return SimpleNamespace(config=config, outcome=outcome, run_id=run_id)


def steps_of(client, run_id, key):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def champion_version(client) -> str:
    return str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version)


def n_optimizer_steps(outcome, epochs):
    return epochs * math.ceil(len(outcome.data.train) / outcome.plan.config.effective_batch_size)


# ---------------------------------------------------------------- params, tags, metrics


def test_params_record_the_batch_contract(fd001_client, trained):
    params = fd001_client.get_run(trained.run_id).data.params
    c = trained.config
    assert params["micro_batch_size"] == "1024"
    assert params["accumulation_steps"] == "1"
    assert params["effective_batch_size"] == str(c.micro_batch_size * c.accumulation_steps)
    assert params["precision"] == str(c.precision)
    tags = fd001_client.get_run(trained.run_id).data.tags
    # auto as precision.py picks it where the run trained (a CPU: by the probe where bf16 is
    # native, fp32 otherwise; a GPU: by its compute capability)
    device = trained.outcome.plan.precision.device
    expected = auto_precision(device, c.model, cpu_measured)
    assert (tags["precision.resolved"], tags["precision.reason"]) == expected
    assert trained.outcome.plan.precision.name == expected[0]
    assert ("CPU" if device.type == "cpu" else "GPU") in tags["precision.reason"]
    assert params["max_grad_norm"] == str(c.max_grad_norm)
    assert params["seed"] == str(c.seed)


def test_tags_record_seeds_code_data_and_environment(fd001_client, trained, real_data_dir):
    tags = fd001_client.get_run(trained.run_id).data.tags
    seeds = derive_seeds(trained.config.seed)
    for key in ("split", "shuffle", "torch", "numpy"):
        assert tags[f"seed.{key}"] == str(getattr(seeds, key))
    assert tags["git_commit"] == "unknown" or len(tags["git_commit"]) == 40
    assert tags["git_dirty"] in ("true", "false", "unknown")
    assert tags["subset"] == "FD001"
    digest = hashlib.sha256((Path(real_data_dir) / "train_FD001.txt").read_bytes()).hexdigest()
    assert tags["data.sha256.train"] == digest
    assert tags["torch_version"] == torch.__version__
    assert tags["device_name"]
    # the run's description: the batch as trained, the seeds and the precision at a glance
    c, plan = trained.config, trained.outcome.plan
    assert tags["mlflow.note.content"] == (
        f"**{c.model}**, effective batch **{c.micro_batch_size * c.accumulation_steps}** = "
        f"micro-batch {c.micro_batch_size} × K {c.accumulation_steps}; seed **{c.seed}** "
        f"(split {seeds.split}, shuffle {seeds.shuffle}, torch {seeds.torch}, numpy "
        f"{seeds.numpy}, python {seeds.python}); precision {plan.precision.name}")


def test_metric_histories_have_one_entry_per_step_and_epoch(fd001_client, trained):
    """Every metric is logged against the global optimizer step: epoch metrics at the step
    where their epoch ended, so the curves line up; `epoch` says which epoch that was."""
    outcome, run_id = trained.outcome, trained.run_id
    epochs = trained.config.epochs
    assert outcome.state.epoch == epochs
    n_steps = n_optimizer_steps(outcome, epochs)
    per_epoch = n_steps // epochs
    for key in STEP_METRICS:
        assert steps_of(fd001_client, run_id, key) == list(range(1, n_steps + 1)), key
    for key in EPOCH_METRICS:
        ends = [per_epoch * e for e in range(1, epochs + 1)]
        assert steps_of(fd001_client, run_id, key) == ends, key
    epoch = sorted(fd001_client.get_metric_history(run_id, "epoch"), key=lambda m: m.step)
    assert [m.value for m in epoch] == list(range(1, epochs + 1))
    val = sorted(fd001_client.get_metric_history(run_id, "val/rmse"), key=lambda m: m.step)
    assert [m.value for m in val] == pytest.approx([h["val_rmse"] for h in outcome.state.history])
    final = fd001_client.get_run(run_id).data.metrics
    for key in FINAL_METRICS:
        assert final[logged(key)] == pytest.approx(outcome.metrics[key], rel=1e-12), key
    # constants are params, never charts
    assert not {"effective_batch_size", "micro_batch_size", "accumulation_steps",
                "short_units_dropped", "windows_lost"} & set(final)
    params = fd001_client.get_run(run_id).data.params
    assert (params["short_units_dropped"], params["windows_lost"]) == ("0", "0")


def test_no_chart_for_what_means_nothing_here(fd001_client, trained):
    """fp32 or bf16 on CPU: no GradScaler, so no amp_scale/skipped_steps (a constant lr, too,
    is only a param: tests/test_mlflow_listener.py)."""
    metrics = fd001_client.get_run(trained.run_id).data.metrics
    assert trained.outcome.plan.precision.name in ("fp32", "bf16")
    assert not trained.outcome.plan.precision.use_scaler
    assert not {"amp_scale", "skipped_steps"} & set(metrics)


def test_the_default_warmup_and_cosine_lr_are_charted_per_step_down_to_zero(fd001_client,
                                                                           trained):
    """make train's schedule as charted: rising over its warm-up epoch's steps to lr (step k
    of the warm-up used lr (k + 1) / warmup), then the cosine down to zero over the rest."""
    assert (trained.config.scheduler, trained.config.warmup_epochs) == ("cosine", 1)
    history = sorted(fd001_client.get_metric_history(trained.run_id, "train/lr"),
                     key=lambda m: m.step)
    steps = n_optimizer_steps(trained.outcome, trained.config.epochs)
    assert [m.step for m in history] == list(range(1, steps + 1))
    warmup = steps * trained.config.warmup_epochs // trained.config.epochs
    lr, rest = trained.config.lr, steps - warmup  # step k used lr(k - 1)
    expected = [lr * (k + 1) / warmup if k < warmup
                else lr * (1 + math.cos(math.pi * (k - warmup) / rest)) / 2
                for k in range(steps)]
    assert [m.value for m in history] == pytest.approx(expected, rel=1e-9)


def test_params_hold_no_none_and_no_keys_the_model_does_not_use(fd001_client, trained):
    params = fd001_client.get_run(trained.run_id).data.params
    assert "None" not in params.values()
    assert "num_heads" not in params  # a transformer key; this is the CNN
    assert {"filters", "kernel_size", "hidden_size", "num_layers", "dropout"} <= set(params)


def test_run_name_and_standard_tags_say_what_ran(fd001_client, trained):
    run = fd001_client.get_run(trained.run_id)
    c = trained.config
    assert run.info.run_name == f"cnn-b{c.effective_batch_size}-k{c.accumulation_steps}-s{c.seed}"
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "rul"
    assert tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.user"]
    if tags["git_commit"] != "unknown":
        assert tags["mlflow.source.git.commit"] == tags["git_commit"]


def test_run_finished_with_three_dataset_inputs(fd001_client, trained):
    run = fd001_client.get_run(trained.run_id)
    assert run.info.status == "FINISHED"
    inputs = run.inputs.dataset_inputs
    assert len(inputs) == 3
    contexts = sorted(
        tag.value for i in inputs for tag in i.tags if tag.key == "mlflow.data.context"
    )
    assert contexts == ["testing", "training", "validation"]
    for logged_input in inputs:  # each table's columns, none with a missing value
        schema = json.loads(logged_input.dataset.schema)["mlflow_colspec"]
        assert [c["name"] for c in schema][:2] == ["unit", "cycle"] and len(schema) == 26
        assert all(c["required"] for c in schema), schema


@pytest.mark.filterwarnings("ignore:Hint. Inferred schema contains integer")
def test_a_logged_table_has_the_schema_mlflow_infers(fd001):
    """The same types and required flags as MLflow's own inference (which tests every value
    in Python), on FD001's table with a user's kinds of column added: names, gaps, int32."""
    from mlflow.types.utils import _infer_schema

    from rul.tracking.run_logging import table_schema

    frame = fd001.train.copy()
    frame["engine"] = "engine-" + frame["unit"].astype(str)
    frame["gappy"] = np.where(frame.index % 7 == 3, np.nan, 1.0)  # the first row has a value
    frame["first_missing"] = np.where(frame.index % 5 == 0, np.nan, 2.0)
    frame["small"] = frame["cycle"].astype("int32")
    ours = table_schema(frame).to_dict()
    assert ours == _infer_schema(frame).to_dict()
    assert [c["required"] for c in ours][-4:] == [True, False, False, True]


@pytest.mark.filterwarnings("ignore:Hint. Inferred schema contains integer")
@pytest.mark.filterwarnings("ignore:The specified dataset source")
def test_a_logged_dataset_carries_its_schema_without_mlflow_testing_each_value(
        fd001, monkeypatch):
    """What a run logs for each table: MLflow's per-value check of missing values (seconds for
    FD001, every run) sees one row at most, and the entity holds the schema all the same."""
    import mlflow.types.utils

    from rul.tracking.run_logging import logged_dataset, table_schema

    checked, real = [], mlflow.types.utils._infer_required
    monkeypatch.setattr(mlflow.types.utils, "_infer_required",
                        lambda col: checked.append(len(col)) or real(col))
    dataset = logged_dataset(fd001.train, "train_FD001.txt", "FD001-training")
    logged = json.loads(dataset._to_mlflow_entity().schema)["mlflow_colspec"]
    assert checked and max(checked) == 1, max(checked)
    assert logged == table_schema(fd001.train).to_dict()


def test_figures_and_weights_are_logged(fd001_client, trained):
    figures = {a.path for a in fd001_client.list_artifacts(trained.run_id, "figures")}
    assert figures >= {"figures/learning_curves.png", "figures/predicted_vs_true.png",
                       "figures/error_histogram.png", "figures/grad_norm.png"}
    weights = {a.path for a in fd001_client.list_artifacts(trained.run_id, "weights")}
    assert "weights/model.pt" in weights


# ---------------------------------------------------------------- registry


def test_model_registered_and_champion_alias_set(fd001_client, trained):
    tags = fd001_client.get_run(trained.run_id).data.tags
    version = tags["registered_version"]
    assert tags["registered_model"] == MODEL_NAME
    registered = fd001_client.get_model_version(MODEL_NAME, version)
    assert registered.run_id == trained.run_id
    assert champion_version(fd001_client) == version
    assert tags["champion_promoted"] == "true"


@pytest.mark.slow
def test_champion_loads_in_a_fresh_process(fd001_store, trained, real_data_dir):
    test_file = Path(real_data_dir) / "test_FD001.txt"
    output = fd001_store.root / "subprocess_predictions.csv"
    script = (
        "import sys, mlflow\n"
        "from rul.data.reader import read_trajectories\n"
        "model = mlflow.pyfunc.load_model('models:/rul-fd001@champion')\n"
        "model.predict(read_trajectories(sys.argv[1])).to_csv(sys.argv[2], index=False)\n"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": fd001_store.uri}
    done = subprocess.run([sys.executable, "-c", script, str(test_file), str(output)],
                          cwd=fd001_store.root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = pd.read_csv(output)
    expected = trained.outcome.predictions
    assert list(result.columns) == ["unit", "rul", "rul_lower", "rul_upper", "p_fail_within",
                                    "padded", "flagged", "flag_reason"]
    np.testing.assert_array_equal(result["unit"], expected["unit"])
    # the served model runs the network as ONNX: within 1e-3 cycles of training's torch
    np.testing.assert_allclose(result["rul"], expected["predicted_rul"], atol=1e-3, rtol=0)
    for bound in ("rul_lower", "rul_upper"):  # the interval calibrated in training
        np.testing.assert_allclose(result[bound], expected[f"predicted_{bound}"], atol=1e-3,
                                   rtol=0)


def test_champion_moves_only_on_improvement(fd001_store, fd001_client, trained):
    champion = champion_version(fd001_client)
    worse_outcome, worse_id = train_tracked(fd001_store.config(epochs=1, lr=1e-5),
                                            progress=False)
    assert worse_outcome.state.best_val_rmse > trained.outcome.state.best_val_rmse
    tags = fd001_client.get_run(worse_id).data.tags
    worse_version = tags["registered_version"]
    assert int(worse_version) > int(champion)
    assert fd001_client.get_model_version(MODEL_NAME, worse_version).run_id == worse_id
    assert tags["champion_promoted"] == "false"
    assert tags["champion_previous_version"] == champion
    assert champion_version(fd001_client) == champion

    # a run is registered once: registering it again keeps its version and its figure
    again = register_and_promote(f"runs:/{worse_id}/model", MODEL_NAME, worse_id, 1e-3)
    assert str(again["registered_version"]) == worse_version
    assert again["champion_promoted"] == "false"
    evidence = {k: v for k, v in tags.items() if k.startswith("selection.")}
    assert evidence["selection.engines"] == fd001_client.get_run(
        trained.run_id).data.tags["selection.engines"]  # one config: the same engines
    try:  # another (finished) run of the same evidence, (faked) better: moves the alias
        better = fd001_client.create_run(fd001_client.get_run(worse_id).info.experiment_id,
                                         tags={**evidence, "selection.rmse": "0.001"})
        fd001_client.set_terminated(better.info.run_id)
        record = register_and_promote(f"runs:/{worse_id}/model", MODEL_NAME,
                                      better.info.run_id, 1e-3)
        assert record["champion_promoted"] == "true"
        assert str(record["champion_previous_version"]) == champion
        new = str(record["registered_version"])
        assert int(new) > int(worse_version)
        assert champion_version(fd001_client) == new
        assert fd001_client.get_model_version(MODEL_NAME, new).tags["champion_promoted"] == "true"
    finally:  # later tests serve the shared run's model as champion
        fd001_client.set_registered_model_alias(MODEL_NAME, CHAMPION, champion)


# ---------------------------------------------------------------- failures


def _run_ids(client, experiment_name) -> set:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return set()
    return {r.info.run_id for r in client.search_runs([experiment.experiment_id])}


def _new_run(client, experiment_name, before: set):
    (run_id,) = _run_ids(client, experiment_name) - before
    return client.get_run(run_id)


def _versions(client):
    return {str(v.version) for v in client.search_model_versions(f"name='{MODEL_NAME}'")}


def test_bad_data_creates_no_run_and_registers_nothing(fd001_store, fd001_client, real_data_dir):
    bad = fd001_store.root / "bad_data"
    shutil.copytree(real_data_dir, bad)
    train_file = bad / "train_FD001.txt"
    lines = train_file.read_text().splitlines()
    tokens = lines[4].split()
    tokens[5] = "x1"  # s_1 of line 5
    lines[4] = " ".join(tokens)
    train_file.write_text("\n".join(lines) + "\n")
    config = fd001_store.config(data_dir=str(bad))
    versions_before = _versions(fd001_client)
    runs_before = _run_ids(fd001_client, config.experiment_name)

    with pytest.raises(DataError, match="line 5"):
        train_tracked(config, progress=False)

    assert _run_ids(fd001_client, config.experiment_name) == runs_before  # checked before the run
    assert _versions(fd001_client) == versions_before


def test_a_window_longer_than_every_unit_is_a_config_error_before_any_run(fd001_store,
                                                                          fd001_client):
    config = fd001_store.config(window=400)
    runs_before = _run_ids(fd001_client, config.experiment_name)
    with pytest.raises(cfg.ConfigError, match=r"window=400: longer than every training unit "
                                              r"of FD001 \(the longest has 362 cycles\)"):
        train_tracked(config, progress=False)
    assert _run_ids(fd001_client, config.experiment_name) == runs_before


class InterruptAfterFirstEpoch(TrainingListener):
    def on_epoch(self, epoch, step, metrics):  # after the MLflow listener flushed the epoch
        if epoch == 1:
            raise KeyboardInterrupt


def test_ctrl_c_kills_the_run_and_resume_finishes_the_same_run(fd001_store, fd001_client):
    config = fd001_store.config(seed=7, register=False)
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    runs_before = _run_ids(fd001_client, config.experiment_name)
    with pytest.raises(KeyboardInterrupt):
        track(plan_run(config), OWN_RUN, open_store(config), InterruptAfterFirstEpoch(),
              progress=False)
    killed = _new_run(fd001_client, config.experiment_name, runs_before)
    assert killed.info.status == "KILLED"
    assert killed.data.tags["error"].startswith("KeyboardInterrupt")
    assert checkpoints.path(killed.info.run_id).is_file()  # the checkpoint belongs to the run

    outcome, run_id = train_tracked(config, resume=True, progress=False)
    assert run_id == killed.info.run_id
    run = fd001_client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert outcome.state.epoch == config.epochs
    assert not checkpoints.path(run_id).exists()
    # the histories continue where they stopped: no step lost, none logged twice
    n_steps = n_optimizer_steps(outcome, config.epochs)
    assert steps_of(fd001_client, run_id, "train/loss") == list(range(1, n_steps + 1))
    assert steps_of(fd001_client, run_id, "epoch") == [n_steps // 2, n_steps]
    assert run.data.params["seed"] == "7"


def test_two_runs_of_one_config_never_share_a_checkpoint(fd001_store, fd001_client):
    """Each run checkpoints to its own file; --resume takes the one it is given by id, or
    the only unfinished one; with two it names both and guesses neither."""
    config = fd001_store.config(seed=11, register=False)
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    killed = []
    for _ in range(2):
        before = _run_ids(fd001_client, config.experiment_name)
        with pytest.raises(KeyboardInterrupt):
            track(plan_run(config), OWN_RUN, open_store(config), InterruptAfterFirstEpoch(),
              progress=False)
        killed.append(_new_run(fd001_client, config.experiment_name, before).info.run_id)
    paths = [checkpoints.path(run_id) for run_id in killed]
    assert paths[0] != paths[1] and all(p.is_file() for p in paths)
    with pytest.raises(FileNotFoundError, match=f"--resume {killed[0]}: that run trained another"):
        train_tracked(config.replace(scheduler="none"), resume=killed[0], progress=False)
    with pytest.raises(CannotResume, match=f"2 unfinished runs of this config can be continued: "
                       f"{killed[1]} .*; {killed[0]} .*; name one: --resume RUN_ID"):
        train_tracked(config, resume=True, progress=False)
    _, resumed = train_tracked(config, resume=killed[0], progress=False)
    assert resumed == killed[0] and not paths[0].exists() and paths[1].is_file()
    _, only = train_tracked(config, resume=True, progress=False)
    assert only == killed[1] and not paths[1].exists()
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train_tracked(config, resume=True, progress=False)


def test_registered_model_description_lists_every_output_column(fd001_client, trained):
    description = fd001_client.get_registered_model(MODEL_NAME).description
    outputs = mlflow.models.get_model_info(trained.outcome.model_uri).signature.outputs
    assert outputs.input_names() == ["unit", "rul", "rul_lower", "rul_upper", "p_fail_within",
                                     "padded", "flagged", "flag_reason"]
    for column in outputs.input_names():
        assert f"- `{column}` (" in description, column
    assert "- `flag_reason` (string): why it is flagged" in description


def test_runs_name_the_commit_the_process_imported_not_a_later_head(monkeypatch):
    """A study that runs for an hour while commits land: every run it logs names the code it
    runs, read when it logged its first."""
    from rul.tracking import run_logging

    heads = iter(["a" * 40, "", "b" * 40, " M rul/cli.py"])
    monkeypatch.setattr(run_logging, "_git", lambda *args: next(heads))
    run_logging.code_version.cache_clear()
    try:
        first = (run_logging.source_tags(), run_logging.environment_tags())
        later = (run_logging.source_tags(), run_logging.environment_tags())
    finally:
        run_logging.code_version.cache_clear()
    for tags in (first, later):
        assert tags[0]["mlflow.source.git.commit"] == "a" * 40
        assert (tags[1]["git_commit"], tags[1]["git_dirty"]) == ("a" * 40, "false")

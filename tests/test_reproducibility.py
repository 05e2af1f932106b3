"""Reproducibility on CPU: same seed -> same bits; accumulation split does not change training;
kill-and-resume continues exactly; `rul train` works end to end."""

import re
from pathlib import Path

import mlflow
import pytest
import torch
from click.testing import CliRunner

from rul import config as cfg
from rul.cli import main
from rul.plan import ResumeTarget, plan_run, prepared
from rul.tracking.metric_names import logged
from rul.training.checkpoint import Checkpointer
from rul.training.listener import TrainingListener
from rul.training.run import train
from rul.training.seeding import derive_seeds

CONFIG_PATH = Path(__file__).resolve().parents[1] / "experiments" / "fd001.yaml"
TINY = {"epochs": 2, "filters": 4, "num_layers": 2, "hidden_size": 16,
        "micro_batch_size": 1024, "accumulation_steps": 1, "patience": 5,
        "device": "cpu", "precision": "fp32"}


def make_config(data_dir, tmp_path, **changes):
    return cfg.load(CONFIG_PATH, {**TINY, "data_dir": str(data_dir),
                                  "checkpoint_dir": str(tmp_path / "ckpt"), **changes})


def run_training(config, subset, resume: ResumeTarget | None = None, **kwargs):
    """Plan `config` on the already loaded `subset` (resuming `resume`), then train it."""
    data = prepared(config, derive_seeds(config.seed).split, subset)
    return train(plan_run(config, resume, data=data), **kwargs)


def weights(outcome) -> dict:
    return {k: v.detach().clone() for k, v in outcome.model.state_dict().items()}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def curves(outcome) -> list:
    """Per-epoch metrics that must repeat exactly (throughput and memory do not)."""
    return [(h["train_loss_epoch"], h["val_rmse"]) for h in outcome.state.history]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_same_seed_gives_bitwise_identical_runs(real_data_dir, fd001, tmp_path, precision):
    """Per precision: bf16 autocast is what `auto` trains the DCNN in on CPUs with native bf16
    (emulated, slower but the same contract, on the others)."""
    config = make_config(real_data_dir, tmp_path, precision=precision)
    first = run_training(config, fd001, progress=False)
    second = run_training(config, fd001, progress=False)
    assert first.metrics == second.metrics
    assert curves(first) == curves(second)
    assert first.predictions.equals(second.predictions)
    assert_same_weights(weights(first), weights(second))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_accumulation_split_does_not_change_training(real_data_dir, fd001, tmp_path, optimizer):
    """The split of B = 512 changes the gradient by float32 rounding only, and so the weights
    after an epoch, with either optimizer (Muon's Newton-Schulz iteration in float32: in bf16,
    as torch.optim.Muon's, they were 6e-3 apart)."""
    outcomes = {}
    for micro, k in ((512, 1), (256, 2), (128, 4)):
        config = make_config(real_data_dir, tmp_path, micro_batch_size=micro,
                             accumulation_steps=k, dropout=0.0, epochs=1, optimizer=optimizer)
        assert config.effective_batch_size == 512
        outcomes[(micro, k)] = run_training(config, fd001, progress=False)
    reference = weights(outcomes[(512, 1)])
    for split, outcome in outcomes.items():
        other = weights(outcome)
        for key in reference:
            torch.testing.assert_close(other[key], reference[key], rtol=1e-4, atol=1e-5,
                                       msg=lambda m, s=split, k=key: f"{s} {k}: {m}")
        assert outcome.metrics["best_val_rmse"] == pytest.approx(
            outcomes[(512, 1)].metrics["best_val_rmse"], rel=1e-4)


class InterruptAtEpoch(TrainingListener):
    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch(self, epoch, step, metrics) -> None:
        if epoch == self.epoch:  # this epoch's checkpoint is already on disk
            raise KeyboardInterrupt


@pytest.mark.parametrize("ema_decay, precision, optimizer", [
    (0.0, "fp32", "adamw"), (0.9, "fp32", "adamw"), (0.9, "bf16", "adamw"),
    (0.9, "fp32", "muon")])
def test_kill_and_resume_matches_the_uninterrupted_run(real_data_dir, fd001, tmp_path, ema_decay,
                                                       precision, optimizer):
    config = make_config(real_data_dir, tmp_path, dropout=0.2, epochs=3, ema_decay=ema_decay,
                         precision=precision, optimizer=optimizer)
    reference = run_training(config, fd001, progress=False)
    assert not (tmp_path / "ckpt").exists()

    checkpointer = Checkpointer(tmp_path / "ckpt" / "run.pt")
    with pytest.raises(KeyboardInterrupt):
        run_training(config, fd001, listener=InterruptAtEpoch(2), checkpointer=checkpointer,
                     progress=False)
    checkpoint = checkpointer.load()
    assert checkpoint["train_state"]["epoch"] == 2
    resumed = run_training(config, fd001, ResumeTarget(checkpointer.path), progress=False)

    assert resumed.state.epoch == 3
    assert resumed.metrics["test_rmse"] == reference.metrics["test_rmse"]
    assert resumed.metrics["best_val_rmse"] == reference.metrics["best_val_rmse"]
    assert resumed.metrics == reference.metrics
    assert curves(resumed) == curves(reference)
    assert resumed.state.step == reference.state.step
    assert_same_weights(weights(resumed), weights(reference))


def test_resume_keeps_the_precision_the_run_started_in(real_data_dir, fd001, tmp_path,
                                                        monkeypatch):
    """`precision: auto` interrupted where it meant fp32 and resumed where it means bf16 (another
    machine, or a newer rul): the run goes on in fp32, as if never interrupted."""
    from rul.training import hardware

    config = make_config(real_data_dir, tmp_path, dropout=0.2, epochs=3, precision="auto")
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)  # auto: fp32
    reference = run_training(config, fd001, progress=False)
    assert reference.plan.precision.name == "fp32"
    checkpointer = Checkpointer(tmp_path / "ckpt" / "run.pt")
    with pytest.raises(KeyboardInterrupt):
        run_training(config, fd001, listener=InterruptAtEpoch(2), checkpointer=checkpointer,
                     progress=False)
    checkpoint = checkpointer.load()
    assert checkpoint["precision"] == "fp32"

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)  # auto: bf16 now
    resumed = run_training(config, fd001, ResumeTarget(checkpointer.path), progress=False)
    precision = resumed.plan.precision
    assert precision.name == "fp32" and "auto would pick bf16" in precision.reason
    assert resumed.metrics == reference.metrics
    assert_same_weights(weights(resumed), weights(reference))


def test_cli_train_end_to_end(real_data_dir, tmp_path, mlflow_store, monkeypatch):
    monkeypatch.setenv("RUL_UI_PORT", "5123")
    overrides = [f"{k}={v}" for k, v in TINY.items() if k not in ("device", "precision")]
    result = CliRunner().invoke(main, [
        "train", str(CONFIG_PATH), *overrides,
        f"tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"checkpoint_dir={tmp_path / 'ckpt'}",
        "--data-dir", str(real_data_dir), "--no-progress",
    ])
    assert result.exit_code == 0, result.output
    printed = re.search(r"test RMSE (\d+\.\d\d) .*\n(?:.*\n)*?run (\w+) in experiment 'rul-fd001'",
                        result.stdout)
    assert printed, result.stdout
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(printed.group(2))  # the summary names the run that holds the results
    assert run.info.status == "FINISHED"
    assert f"{run.data.metrics[logged('test_rmse')]:.2f}" == printed.group(1)
    assert client.get_model_version_by_alias("rul-fd001", "champion").run_id == run.info.run_id
    assert not list((tmp_path / "ckpt").glob("*.pt"))  # finished: checkpoint removed
    experiment_id = run.info.experiment_id  # the hint opens its runs view on the port used
    assert (f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db --port 5123, then "
            f"http://127.0.0.1:5123/#/experiments/{experiment_id}"
            "?workflowType=machine_learning") in result.stdout  # no Makefile here: no make ui

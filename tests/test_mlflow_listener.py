"""What the MLflow listener charts: AMP metrics only with a GradScaler, lr only with a schedule,
the micro-batch split only once an out-of-memory back-off changed it, everything at the global
optimizer step under its group's name (no MLflow store needed: the client is replaced)."""

from rul.tracking.mlflow_listener import MLflowListener
from rul.training.step import StepResult


class Recorder:
    def __init__(self):
        self.batches = []

    def log_batch(self, run_id, metrics):
        self.batches.append(metrics)


def logged(amp: bool, scheduled_lr: bool, epochs=({"val_rmse": 20.0},)) -> dict:
    listener = MLflowListener("run", amp=amp, scheduled_lr=scheduled_lr, micro_batch_size=256,
                              accumulation_steps=2)
    listener.client = Recorder()
    skipped = StepResult(loss=0.5, grad_norm=float("inf"), clipped=False, skipped=True,
                         lr=1e-3, scale=65536.0)
    real = StepResult(loss=0.4, grad_norm=2.0, clipped=True, skipped=False, lr=9e-4,
                      scale=32768.0)
    listener.on_step(1, skipped)
    listener.on_step(2, real)
    for epoch, metrics in enumerate(epochs, start=1):
        listener.on_epoch(epoch, 2 * epoch, metrics)
    return {(m.key, m.step): m.value for batch in listener.client.batches for m in batch}


def test_amp_metrics_and_a_scheduled_lr_are_charted_when_they_mean_something():
    metrics = logged(amp=True, scheduled_lr=True)
    assert metrics[("amp_scale", 1)] == 65536.0 and metrics[("amp_scale", 2)] == 32768.0
    assert metrics[("skipped_steps", 1)] == 1 and metrics[("skipped_steps", 2)] == 1
    assert metrics[("train/lr", 2)] == 9e-4
    assert metrics[("val/rmse", 2)] == 20.0 and metrics[("epoch", 2)] == 1  # at the global step


def test_fp32_and_a_constant_lr_chart_neither():
    keys = {key for key, _ in logged(amp=False, scheduled_lr=False)}
    assert not keys & {"amp_scale", "skipped_steps", "train/lr"}
    assert {"train/loss", "train/grad_norm", "clipped", "val/rmse", "epoch"} <= keys
    # the curves by group, first in the UI; the 0/1 and counter charts after them
    assert sorted(k for k in keys if "/" in k) == ["train/grad_norm", "train/loss", "val/rmse"]


def test_the_split_is_charted_only_once_a_back_off_changed_it():
    """Micro-batch 256 x 2 are params; after an out-of-memory back-off to 128 x 4 the split
    is charted from that epoch on. The effective batch never changes: it is a param only."""
    split = {"micro_batch_size": 256, "accumulation_steps": 2}
    halved = {"micro_batch_size": 128, "accumulation_steps": 4}
    metrics = logged(amp=False, scheduled_lr=False, epochs=(
        {"val_rmse": 20.0, **split}, {"val_rmse": 19.0, **halved}))
    assert metrics[("micro_batch_size", 4)] == 128 and metrics[("accumulation_steps", 4)] == 4
    assert ("micro_batch_size", 2) not in metrics
    assert not [k for k, _ in metrics if "effective_batch" in k]

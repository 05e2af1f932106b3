"""What the MLflow listener charts: AMP metrics only with a GradScaler, lr only with a schedule,
everything at the global optimizer step (no MLflow store needed: the client is replaced)."""

from rul.tracking.mlflow_listener import MLflowListener
from rul.training.step import StepResult


class Recorder:
    def __init__(self):
        self.batches = []

    def log_batch(self, run_id, metrics):
        self.batches.append(metrics)


def logged(amp: bool, scheduled_lr: bool) -> dict:
    listener = MLflowListener("run", amp=amp, scheduled_lr=scheduled_lr, effective_batch_size=512)
    listener.client = Recorder()
    skipped = StepResult(loss=0.5, grad_norm=float("inf"), clipped=False, skipped=True,
                         lr=1e-3, scale=65536.0)
    real = StepResult(loss=0.4, grad_norm=2.0, clipped=True, skipped=False, lr=9e-4,
                      scale=32768.0)
    listener.on_step(1, skipped)
    listener.on_step(2, real)
    listener.on_epoch(1, 2, {"val_rmse": 20.0})
    return {(m.key, m.step): m.value for batch in listener.client.batches for m in batch}


def test_amp_metrics_and_a_scheduled_lr_are_charted_when_they_mean_something():
    metrics = logged(amp=True, scheduled_lr=True)
    assert metrics[("amp_scale", 1)] == 65536.0 and metrics[("amp_scale", 2)] == 32768.0
    assert metrics[("skipped_steps", 1)] == 1 and metrics[("skipped_steps", 2)] == 1
    assert metrics[("lr", 2)] == 9e-4
    assert metrics[("val_rmse", 2)] == 20.0 and metrics[("epoch", 2)] == 1  # at the global step
    assert metrics[("effective_batch_size", 2)] == 512


def test_fp32_and_a_constant_lr_chart_neither():
    keys = {key for key, _ in logged(amp=False, scheduled_lr=False)}
    assert not keys & {"amp_scale", "skipped_steps", "lr"}
    assert {"train_loss", "grad_norm", "clipped", "val_rmse", "epoch"} <= keys

"""The engine's listener that records training to MLflow, batched: one log_batch per epoch.

SQLite writes cost tens of ms each; per-step logging would dominate a fast epoch, so step
metrics are buffered and written with the epoch's metrics in one call. Every metric is logged
against the global optimizer step, so per-step and per-epoch curves share one x axis; the
epoch is a metric too, to plot against. Names by group (rul.tracking.metric_names). What
never changes in a run is a param, not a curve: the effective batch size always, the
micro-batch size and accumulation steps until an out-of-memory back-off changes them (from
then on they are logged every epoch).
"""

import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from rul.interrupts import deferred
from rul.tracking.metric_names import logged
from rul.training.listener import TrainingListener

MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit


class MLflowListener(TrainingListener):
    def __init__(self, run_id: str, *, amp: bool, scheduled_lr: bool, micro_batch_size: int,
                 accumulation_steps: int):
        self.run_id = run_id
        self.amp = amp  # a GradScaler runs: its scale and skipped steps mean something
        self.scheduled_lr = scheduled_lr  # a constant lr is a param, not a curve
        self.split = (micro_batch_size, accumulation_steps)  # the params' split
        self.client = MlflowClient()
        self.buffer: list[Metric] = []
        self.skipped_steps = 0

    @classmethod
    def of(cls, plan, run_id: str) -> "MLflowListener":
        """The listener of run `run_id`, which trains `plan` (rul.plan.RunPlan)."""
        config = plan.config
        return cls(run_id, amp=plan.precision.use_scaler, scheduled_lr=config.scheduler != "none",
                   micro_batch_size=config.micro_batch_size,
                   accumulation_steps=config.accumulation_steps)

    def _add(self, metrics: dict, step: int) -> None:
        now = int(time.time() * 1000)
        self.buffer += [Metric(logged(k), float(v), now, step) for k, v in metrics.items()]

    def on_step(self, step, result) -> None:
        metrics = {"train_loss": result.loss, "grad_norm": result.grad_norm,
                   "clipped": float(result.clipped)}
        if self.scheduled_lr:
            metrics["lr"] = result.lr
        if self.amp:
            self.skipped_steps += result.skipped
            metrics.update(amp_scale=result.scale, skipped_steps=self.skipped_steps)
        self._add(metrics, step)

    def on_epoch(self, epoch, step, metrics) -> None:
        split = ("micro_batch_size", "accumulation_steps")
        changed = tuple(metrics.get(k) for k in split) != self.split  # an OOM back-off
        self._add({**{k: v for k, v in metrics.items() if changed or k not in split},
                   "epoch": epoch}, step)
        self.flush()

    def catch_up(self, state: dict) -> None:
        """A resumed run's epochs that its store missed (a write failed after the epoch's
        checkpoint was saved: a read-only or full store), logged from the checkpoint's
        history (`state`, its train_state) at their steps; their per-step curves are lost."""
        logged_epochs = {int(m.value) for m in self.client.get_metric_history(self.run_id,
                                                                              "epoch")}
        per_epoch = state["step"] // max(state["epoch"], 1)
        for epoch, metrics in enumerate(state["history"], start=1):
            if epoch not in logged_epochs:
                self.on_epoch(epoch, epoch * per_epoch, metrics)

    def flush(self) -> None:
        with deferred():  # a signal must not cut a database write in half
            for i in range(0, len(self.buffer), MAX_METRICS_PER_CALL):
                self.client.log_batch(self.run_id,
                                      metrics=self.buffer[i : i + MAX_METRICS_PER_CALL])
        self.buffer = []

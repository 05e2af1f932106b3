"""Engine callback that records training to MLflow, batched: one log_batch per epoch.

SQLite writes cost tens of ms each; per-step logging would dominate a fast epoch, so step
metrics are buffered and written with the epoch's metrics in one call.
"""

import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from rul.training.engine import Callback

MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit


class MLflowCallback(Callback):
    def __init__(self, run_id: str):
        self.run_id = run_id
        self.client = MlflowClient()
        self.buffer: list[Metric] = []

    def _add(self, metrics: dict, step: int) -> None:
        now = int(time.time() * 1000)
        self.buffer += [Metric(k, float(v), now, step) for k, v in metrics.items()]

    def on_step(self, state, result) -> None:
        self._add({"train_loss": result.loss, "grad_norm": result.grad_norm, "lr": result.lr,
                   "amp_scale": result.scale, "clipped": float(result.clipped),
                   "skipped_steps": state.skipped_steps}, state.step)

    def on_epoch(self, state, metrics) -> None:
        self._add(metrics, state.epoch)
        self.flush()

    def flush(self) -> None:
        for i in range(0, len(self.buffer), MAX_METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=self.buffer[i : i + MAX_METRICS_PER_CALL])
        self.buffer = []

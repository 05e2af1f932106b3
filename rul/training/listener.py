"""What the engine tells the outside world (tracking, pruning, tests), as plain values."""

from rul.training.step import StepResult


class TrainingListener:
    """Override what you need. The engine knows nothing about MLflow or Optuna."""

    def on_step(self, step: int, result: StepResult) -> None:
        """After optimizer step `step` (1-based, skipped fp16 steps included)."""

    def on_epoch(self, epoch: int, step: int, metrics: dict[str, float]) -> None:
        """After epoch `epoch` (1-based) ended at optimizer step `step`; its checkpoint is
        already written. May raise to stop training (a pruned trial)."""


class Listeners(TrainingListener):
    """Several listeners, called in order."""

    def __init__(self, *listeners: TrainingListener | None):
        self.listeners = [listener for listener in listeners if listener is not None]

    def on_step(self, step, result) -> None:
        for listener in self.listeners:
            listener.on_step(step, result)

    def on_epoch(self, epoch, step, metrics) -> None:
        for listener in self.listeners:
            listener.on_epoch(epoch, step, metrics)

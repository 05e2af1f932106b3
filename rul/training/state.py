"""A run's progress: what a checkpoint must carry, besides the training parts, to continue a
run exactly where it stopped (rul.training.checkpoint writes it as plain data)."""

import copy
import math
from dataclasses import dataclass, field, fields

import torch

from rul.training.step import StepResult


@dataclass
class TrainState:
    """Progress that a checkpoint must carry to continue a run exactly, early stopping's
    included (the best validation RMSE, its epoch and weights, the epochs since)."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps attempted (skipped ones included)
    skipped_steps: int = 0
    best_val_rmse: float = math.inf
    best_epoch: int = 0  # 1-based; 0 = none yet
    bad_epochs: int = 0
    best_weights: dict | None = None
    history: list = field(default_factory=list)  # one dict of epoch metrics per epoch
    grad_norms: list = field(default_factory=list)  # unscaled, one per optimizer step

    def record_step(self, result: StepResult) -> None:
        self.step += 1
        self.skipped_steps += result.skipped
        self.grad_norms.append(result.grad_norm)

    def end_epoch(self, val_rmse: float, evaluated: torch.nn.Module) -> None:
        """One more epoch done, with its validation RMSE: keep `evaluated`'s weights when it
        is the best so far, else count a bad epoch."""
        self.epoch += 1
        if val_rmse < self.best_val_rmse:
            self.best_val_rmse, self.best_epoch, self.bad_epochs = val_rmse, self.epoch, 0
            self.best_weights = copy.deepcopy(evaluated.state_dict())
        else:
            self.bad_epochs += 1

    def restore_best(self, model: torch.nn.Module) -> None:
        if self.best_weights is not None:
            model.load_state_dict(self.best_weights)

    def as_dict(self) -> dict:
        """The state as a checkpoint holds it: its fields by name (no copy)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, saved: dict) -> "TrainState":
        """The state `as_dict` gave (a checkpoint's `train_state`)."""
        return cls(**saved)

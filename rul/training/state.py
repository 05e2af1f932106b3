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

    @classmethod
    def problem(cls, saved, epochs: int | None = None) -> str | None:
        """Why `saved` (a checkpoint's train_state) is not a state rul writes for a run of
        `epochs` epochs (None: not checked): every field, counts that agree, at most `epochs`
        epochs done, a finite non-negative best RMSE (inf before the first epoch), one history
        entry of numbers per epoch; None when it is one."""
        if not isinstance(saved, dict):
            return "its train_state is not a mapping"
        names = [f.name for f in fields(cls)]
        odd = [n for n in names if n not in saved] or sorted(map(str, set(saved) - set(names)))
        if odd:
            return f"its train_state {'lacks' if odd[0] in names else 'has unknown'} {odd[0]}"
        counts = ("epoch", "step", "skipped_steps", "best_epoch", "bad_epochs")
        bad = next((n for n in counts if not _count(saved[n])), None)
        if bad is not None:
            return f"its train_state.{bad} is {saved[bad]!r}, not a count"
        epoch, best, history = saved["epoch"], saved["best_val_rmse"], saved["history"]
        if epochs is not None and epoch > epochs:
            return f"its train_state.epoch {epoch} is beyond the run's {epochs} epochs"
        if max(saved["best_epoch"], saved["bad_epochs"]) > epoch or \
                saved["skipped_steps"] > saved["step"]:
            return "its train_state's counts disagree (best or bad epochs past the epoch, or " \
                   "more skipped steps than steps)"
        none_yet = saved["best_epoch"] == 0
        if not _number(best) or not (best == math.inf if none_yet else 0 <= best < math.inf):
            return f"its train_state.best_val_rmse is {best!r}, not a finite RMSE >= 0"
        if none_yet != (saved["best_weights"] is None) or not (
                none_yet or isinstance(saved["best_weights"], dict)):
            return "its train_state.best_weights do not match its best epoch"
        if not isinstance(history, list) or len(history) != epoch or not all(
                isinstance(e, dict) and all(map(_number, e.values())) for e in history):
            return f"its train_state.history is not {epoch} epochs of numbers"
        if not isinstance(saved["grad_norms"], list):
            return "its train_state.grad_norms is not a list"
        return None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

"""Early stopping on validation RMSE, keeping the best weights seen."""

import copy

from torch import nn


class EarlyStopping:
    """Tracks the best validation RMSE in a TrainState (so a checkpoint carries it)."""

    def __init__(self, patience: int):
        self.patience = patience

    def should_stop(self, state) -> bool:
        return state.bad_epochs >= self.patience

    def update(self, state, val_rmse: float, evaluated: nn.Module) -> bool:
        """Record epoch `state.epoch`'s validation RMSE; True if it is the best so far."""
        if val_rmse < state.best_val_rmse:
            state.best_val_rmse, state.best_epoch, state.bad_epochs = val_rmse, state.epoch, 0
            state.best_weights = copy.deepcopy(evaluated.state_dict())
            return True
        state.bad_epochs += 1
        return False

    @staticmethod
    def restore_best(model: nn.Module, state) -> None:
        if state.best_weights is not None:
            model.load_state_dict(state.best_weights)

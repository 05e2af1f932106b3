"""A moving average of the weights (EMA) for validation and the returned model."""

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel


def ema_with_warmup(decay: float):
    """AveragedModel update: w_avg <- d*w_avg + (1-d)*w with d = min(decay, (1+n)/(10+n)).

    n = updates so far. The warm-up keeps the average near the current weights while they move
    fast, so averaging in early weights far from where training ends cannot stall validation
    (and with it early stopping).
    """
    def update(averaged: list, current: list, n_averaged: torch.Tensor) -> None:
        n = int(n_averaged)
        d = min(decay, (1 + n) / (10 + n))
        for a, c in zip(averaged, current, strict=True):
            a.lerp_(c, 1 - d)

    return update


def weight_average(model: nn.Module, decay: float) -> AveragedModel | None:
    """torch's AveragedModel with the warm-up above, its update count on the model's device
    (a sync-free step counts there: sync_free.average_on_device); None when `decay` is 0."""
    if not decay:
        return None
    device = next(model.parameters()).device
    return AveragedModel(model, device=device, multi_avg_fn=ema_with_warmup(decay),
                         use_buffers=True)

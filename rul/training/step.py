"""One optimizer step over an effective batch: the training contract in one screen."""

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class StepResult:
    loss: float  # sample-weighted mean loss over the whole effective batch
    grad_norm: float  # unscaled, before clipping
    clipped: bool
    skipped: bool  # inf/NaN gradient: optimizer did not step
    lr: float
    scale: float  # GradScaler scale used for this step (1.0 without a scaler)


def optimizer_step(model: nn.Module, optimizer, scaler, micro_batches, precision,
                   max_grad_norm: float | None, target_scale: float = 1.0,
                   weights: list[float] | None = None) -> StepResult:
    """Accumulate gradients over `micro_batches` [(x, y), ...] and take one optimizer step.

    Each micro-batch's mean loss is weighted by its share of the effective batch's samples, so
    the accumulated gradient equals the gradient of the mean loss over the whole effective
    batch, also when the last one of an epoch is short. Under DDP, `no_sync` covers forward
    and backward of every micro-batch but the last, so gradients are all-reduced once.
    The loss is the MSE of RUL / target_scale (O(1) gradients: no fp16 overflow, and a
    max_grad_norm of 1.0 means something); predictions and targets stay in cycles.
    `weights` overrides the weights (DDP: the share of the global batch x world size, see
    distributed.share_weights; 0 for the stand-in micro-batch of a rank with no samples).
    """
    if weights is None:
        total = sum(len(y) for _, y in micro_batches)
        weights = [len(y) / total for _, y in micro_batches]
    lr, scale = optimizer.param_groups[0]["lr"], scaler.get_scale() if scaler.is_enabled() else 1.0
    loss_sum = torch.zeros((), device=micro_batches[0][1].device)
    for i, ((x, y), weight) in enumerate(zip(micro_batches, weights, strict=True)):
        last = i == len(micro_batches) - 1
        with nullcontext() if last else getattr(model, "no_sync", nullcontext)():
            with precision.autocast():
                loss = nn.functional.mse_loss(model(x).float() / target_scale, y / target_scale)
            weighted = loss * weight
            scaler.scale(weighted).backward()
        loss_sum += weighted.detach()
    scaler.unscale_(optimizer)  # grads now true fp32 values; inf/NaN recorded for step()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf).item()
    finite = math.isfinite(grad_norm)
    if scaler.is_enabled():
        scaler.step(optimizer)  # skips the step itself if unscale_ found inf/NaN
        scaler.update()  # halves the scale after a skip; never changes inside the window
    elif finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(
        loss=loss_sum.item(), grad_norm=grad_norm,
        clipped=finite and max_grad_norm is not None and grad_norm > max_grad_norm,
        skipped=not finite, lr=lr, scale=scale,
    )

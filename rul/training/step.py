"""One optimizer step over an effective batch: the training contract in one screen."""

import math
from contextlib import nullcontext
from dataclasses import astuple, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class StepSettings:
    """What every step of a run computes with, fixed for the run: the precision, clipping, the
    loss scale (the config's rul_cap) and the ranks that share each effective batch."""

    precision: object  # rul.training.precision.Precision
    max_grad_norm: float | None = 1.0
    target_scale: float = 1.0
    world_size: int = 1

    @classmethod
    def of(cls, config, precision, world_size: int = 1) -> "StepSettings":
        return cls(precision, config.max_grad_norm, config.rul_cap, world_size)


@dataclass
class StepResult:
    """Floats, or 0-dim tensors on the device when the step decided there (sync-free)."""

    loss: float  # sample-weighted mean loss over the whole effective batch
    grad_norm: float  # unscaled, before clipping
    clipped: bool
    skipped: bool  # inf/NaN gradient (fp16: or its effective batch overflows): no step
    lr: float
    scale: float  # GradScaler scale used for this step (1.0 without a scaler)

    def packed(self, device: torch.device) -> torch.Tensor:
        """The six values in one float64 tensor on `device` (a sync-free step's record; a
        Python number is filled in there, never copied from the host)."""
        return torch.stack([v.to(torch.float64) if isinstance(v, torch.Tensor)
                            else torch.full((), float(v), dtype=torch.float64, device=device)
                            for v in astuple(self)])

    @classmethod
    def unpacked(cls, row: list[float]) -> "StepResult":
        loss, grad_norm, clipped, skipped, lr, scale = row
        return cls(loss, grad_norm, bool(clipped), bool(skipped), lr, scale)


def optimizer_step(model: nn.Module, optimizer, scaler, micro_batches, settings: StepSettings,
                   weights: list[float] | None = None) -> StepResult:
    """Accumulate gradients over `micro_batches` [(x, y), ...] and take one optimizer step.

    Each micro-batch's mean loss is weighted by its share of the effective batch's samples, so
    the accumulated gradient equals the gradient of the mean loss over the whole effective
    batch, also when the last one of an epoch is short. Under DDP, `no_sync` covers forward
    and backward of every micro-batch but the last, so gradients are all-reduced once.
    The loss is the MSE of RUL / settings.target_scale (O(1) gradients: no fp16 overflow, and a
    max_grad_norm of 1.0 means something); predictions and targets stay in cycles.
    `weights` overrides the weights (DDP: the share of the global batch x world size, see
    distributed.share_weights; 0 for the stand-in micro-batch of a rank with no samples).

    Unscale once, then clip, step and update. Whether the step is skipped is decided on the
    host (a CPU, where reading a value costs nothing) or, with an optimizer that takes the
    decision as a tensor (decides_on_device: fused AdamW on CUDA), on the device: then
    nothing here waits for the GPU and the result's values are tensors.
    """
    max_grad_norm, target_scale = settings.max_grad_norm, settings.target_scale
    if weights is None:
        total = sum(len(y) for _, y in micro_batches)
        weights = [len(y) / total for _, y in micro_batches]
    on_device = decides_on_device(optimizer)
    lr = optimizer.param_groups[0]["lr"]
    lr = lr.clone() if on_device else lr
    scale = 1.0 if not scaler.is_enabled() else None if on_device else scaler.get_scale()
    loss_sum = torch.zeros((), device=micro_batches[0][1].device)
    for i, ((x, y), weight) in enumerate(zip(micro_batches, weights, strict=True)):
        last = i == len(micro_batches) - 1
        with nullcontext() if last else getattr(model, "no_sync", nullcontext)():
            with settings.precision.autocast():
                loss = nn.functional.mse_loss(model(x).float() / target_scale, y / target_scale)
            weighted = loss * weight
            scaler.scale(weighted).backward()
        loss_sum += weighted.detach()
    if scale is None:  # on the device: the scale scale() used (created by its first call)
        scale = scaler._get_scale_async().clone()
    scaler.unscale_(optimizer)  # grads now true fp32 values; inf/NaN recorded for step()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf)
    if on_device:
        skipped = _step_on_device(optimizer, scaler, grad_norm, scale)
    else:
        grad_norm = grad_norm.item()
        skipped = _step_on_host(optimizer, scaler, grad_norm, scale)
    optimizer.zero_grad(set_to_none=True)
    clipped = max_grad_norm is not None and grad_norm > max_grad_norm
    return StepResult(loss=loss_sum if on_device else loss_sum.item(), grad_norm=grad_norm,
                      clipped=clipped & ~skipped if on_device else clipped and not skipped,
                      skipped=skipped, lr=lr, scale=scale)


def decides_on_device(optimizer) -> bool:
    """Whether `optimizer` takes the skip decision as a tensor and its rate as one (fused
    AdamW, see optim.make_optimizer): the training step then never waits for the device."""
    return all(group.get("fused") and isinstance(group["lr"], torch.Tensor)
               for group in optimizer.param_groups)


def _step_on_host(optimizer, scaler, grad_norm: float, scale: float) -> bool:
    if scaler.is_enabled():
        scaler.step(optimizer)  # skips the step itself if unscale_ found inf/NaN
        scaler.update()  # halves the scale after a skip; never changes inside the window
        return scaler.get_scale() < scale  # it halved: the step was skipped
    if not math.isfinite(grad_norm):
        return True
    optimizer.step()
    return False


def _step_on_device(optimizer, scaler, grad_norm: torch.Tensor,
                    scale: torch.Tensor | float) -> torch.Tensor:
    """The fused optimizer skips its update on the device when found_inf is set (as
    GradScaler.step passes it); without a scaler, found_inf is a non-finite gradient norm."""
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
        return scaler._get_scale_async() < scale
    skipped = ~torch.isfinite(grad_norm)
    optimizer.grad_scale, optimizer.found_inf = None, skipped.float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf
    return skipped

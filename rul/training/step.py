"""One optimizer step over an effective batch: the training contract in one screen."""

import math
from contextlib import nullcontext
from dataclasses import astuple, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class StepSettings:
    """What every step of a run computes with, fixed for the run (rul.plan decides it): the
    precision, clipping, the loss scale (the target's cap) and the ranks that share each
    effective batch."""

    precision: object  # rul.training.precision.Precision
    max_grad_norm: float | None = 1.0
    target_scale: float = 1.0
    world_size: int = 1


@dataclass
class StepResult:
    """Floats, or 0-dim tensors on the device when the step decided there (sync-free). For
    stacked members (rul.models.stacking) loss, grad_norm, clipped and skipped are one per
    member (tensors of shape (members,)): `member` reads one member's."""

    loss: float  # sample-weighted mean loss over the whole effective batch
    grad_norm: float  # unscaled, before clipping
    clipped: bool
    skipped: bool  # inf/NaN gradient (fp16: or its effective batch overflows): no step
    lr: float
    scale: float  # GradScaler scale used for this step (1.0 without a scaler)

    @property
    def stepped(self):
        """Whether the optimizer stepped: not all members skipped (a bool, or a 0-dim tensor
        on the device)."""
        skipped = self.skipped
        return ~skipped.all() if isinstance(skipped, torch.Tensor) else not skipped

    def member(self, index: int) -> "StepResult":
        """Member `index`'s values of a stacked step, as floats."""
        def one(value):
            value = value[index] if isinstance(value, torch.Tensor) and value.dim() else value
            return value.item() if isinstance(value, torch.Tensor) else value

        return StepResult(float(one(self.loss)), float(one(self.grad_norm)),
                          bool(one(self.clipped)), bool(one(self.skipped)), float(one(self.lr)),
                          float(one(self.scale)))

    def packed(self, device: torch.device) -> torch.Tensor:
        """The six values in one float64 tensor on `device`, (6,) or (6, members) (a sync-free
        step's record; a Python number is filled in there, never copied from the host)."""
        values = [v.to(torch.float64) if isinstance(v, torch.Tensor)
                  else torch.full((), float(v), dtype=torch.float64, device=device)
                  for v in astuple(self)]
        return torch.stack(torch.broadcast_tensors(*values))

    @classmethod
    def unpacked(cls, row: list) -> "StepResult":
        loss, grad_norm, clipped, skipped, lr, scale = row
        if isinstance(loss, list):  # stacked members: one value each
            return cls(torch.tensor(loss), torch.tensor(grad_norm), torch.tensor(clipped) > 0,
                       torch.tensor(skipped) > 0, lr[0], scale[0])
        return cls(loss, grad_norm, bool(clipped), bool(skipped), lr, scale)


def rul_loss(predicted: torch.Tensor, target: torch.Tensor, scale: float) -> torch.Tensor:
    """The training loss, in one place: the MSE of RUL / scale (O(1) gradients: no fp16
    overflow, and a max_grad_norm of 1.0 means something). Stacked members (a leading
    dimension): each member's mean over its samples, so that each member's gradient is that
    of its own loss. A target with one more leading dimension than the prediction is a range
    [lower, upper] per sample (an engine in service: rul.preprocessing.censored): the mean
    squared distance to it, nothing inside it, the MSE where lower == upper."""
    if target.dim() > predicted.dim():
        predicted, (lower, upper) = predicted.float() / scale, target / scale
        below, above = (lower - predicted).clamp(min=0), (predicted - upper).clamp(min=0)
        return (below.square() + above.square()).mean(dim=-1)
    if predicted.dim() == 1:
        return nn.functional.mse_loss(predicted.float() / scale, target / scale)
    return nn.functional.mse_loss(predicted.float() / scale, target / scale,
                                  reduction="none").mean(dim=-1)


def clip_gradients(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Clip the gradients to `max_norm` (None: measure only) by torch's rule (the global L2
    norm, scaled by min(1, max_norm / (norm + 1e-6))), each of stacked members on its own;
    return the norm before clipping (one per member)."""
    members = getattr(model, "members", None)
    if members is None:
        return nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = torch.stack([nn.utils.get_total_norm([g[m] for g in grads])
                         for m in range(members)])
    if max_norm is not None:
        coefficient = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
        for grad in grads:
            grad.mul_(coefficient.view(-1, *[1] * (grad.dim() - 1)))
    return norms


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
    decision as a tensor (decides_on_device: fused AdamW or Muon on CUDA), on the device:
    then nothing here waits for the GPU and the result's values are tensors.
    """
    if weights is None:  # the samples of each micro-batch (of each member: the last axis)
        total = sum(y.shape[-1] for _, y in micro_batches)
        weights = [y.shape[-1] / total for _, y in micro_batches]
    on_device = decides_on_device(optimizer)
    lr = optimizer.param_groups[0]["lr"]
    lr = lr.clone() if on_device else lr
    scale = 1.0 if not scaler.is_enabled() else None if on_device else scaler.get_scale()
    loss = _accumulate(model, scaler, micro_batches, weights, settings)
    if scale is None:  # on the device: the scale scale() used (created by its first call)
        scale = scaler._get_scale_async().clone()
    scaler.unscale_(optimizer)  # grads now true fp32 values; inf/NaN recorded for step()
    grad_norm = clip_gradients(model, settings.max_grad_norm)
    step = (_step_on_device if on_device else _step_stacked if grad_norm.dim()
            else _step_on_host)
    grad_norm, skipped, clipped = _take_step(step, optimizer, scaler, grad_norm, scale,
                                             settings.max_grad_norm)
    optimizer.zero_grad(set_to_none=True)
    loss = loss if on_device else loss.cpu() if loss.dim() else loss.item()
    return StepResult(loss=loss, grad_norm=grad_norm, clipped=clipped, skipped=skipped, lr=lr,
                      scale=scale)


def _accumulate(model, scaler, micro_batches, weights, settings: StepSettings) -> torch.Tensor:
    """Forward and backward of each micro-batch, its loss weighted; the weighted loss's sum
    (one per stacked member)."""
    loss_sum = None
    for i, ((x, y), weight) in enumerate(zip(micro_batches, weights, strict=True)):
        last = i == len(micro_batches) - 1
        with nullcontext() if last else getattr(model, "no_sync", nullcontext)():
            with settings.precision.autocast():
                loss = rul_loss(model(x), y, settings.target_scale)
            weighted = loss * weight
            scaler.scale(weighted.sum()).backward()  # stacked: each member's own gradient
        loss_sum = weighted.detach() if loss_sum is None else loss_sum + weighted.detach()
    return loss_sum


def _take_step(step, optimizer, scaler, grad_norm: torch.Tensor, scale, max_grad_norm):
    """Step (or skip) by `step`, where the decision is taken: (grad_norm, skipped, clipped),
    floats and bools on the host, tensors when decided on the device or for stacked members."""
    if step is not _step_on_host:
        skipped = step(optimizer, scaler, grad_norm, scale)
        clipped = ((grad_norm > max_grad_norm) & ~skipped if max_grad_norm is not None
                   else torch.zeros_like(skipped))
        return grad_norm, skipped, clipped
    grad_norm = grad_norm.item()
    skipped = _step_on_host(optimizer, scaler, grad_norm, scale)
    return grad_norm, skipped, max_grad_norm is not None and grad_norm > max_grad_norm and \
        not skipped


def decides_on_device(optimizer) -> bool:
    """Whether `optimizer` takes the skip decision as a tensor and its rate as one, as
    optim.make_optimizer built it (its row of OPTIMIZER_KINDS, on CUDA): the training step
    then never waits for the device."""
    return getattr(optimizer, "on_device", False)


def _step_on_host(optimizer, scaler, grad_norm: float, scale: float) -> bool:
    if scaler.is_enabled():
        scaler.step(optimizer)  # skips the step itself if unscale_ found inf/NaN
        scaler.update()  # halves the scale after a skip; never changes inside the window
        return scaler.get_scale() < scale  # it halved: the step was skipped
    if not math.isfinite(grad_norm):
        return True
    optimizer.step()
    return False


def _step_stacked(optimizer, scaler, grad_norms: torch.Tensor, scale) -> torch.Tensor:
    """Stacked members (fp32: no scaler) take the step together: a member whose gradient is
    not finite is recorded as skipped, its weights turn NaN and early stopping keeps its best
    ones; only when every member's gradient is not finite is the step not taken."""
    skipped = ~torch.isfinite(grad_norms)
    if not skipped.all():
        optimizer.step()
    return skipped


def _step_on_device(optimizer, scaler, grad_norm: torch.Tensor,
                    scale: torch.Tensor | float) -> torch.Tensor:
    """The optimizer skips its update on the device when found_inf is set (as GradScaler.step
    passes it to one that takes it: fused AdamW, MuonAdamW); without a scaler, found_inf is a
    non-finite gradient norm."""
    if scaler.is_enabled():
        scaler.step(optimizer)
        scaler.update()
        return scaler._get_scale_async() < scale
    skipped = ~torch.isfinite(grad_norm)  # stacked members: one each; the step skipped by all
    optimizer.grad_scale, optimizer.found_inf = None, skipped.all().float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf
    return skipped

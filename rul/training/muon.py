"""Muon for the network's weight matrices and AdamW for the rest, as one optimizer
(`optimizer: muon`, make train's).

Muon (Jordan et al. 2024; torch.optim.Muon) moves each weight matrix along the semi-orthogonal
matrix nearest its Nesterov momentum, found by a few Newton-Schulz iterations: every direction
of the matrix moves at one rate, so a large effective batch, which has few steps, needs fewer
of them (docs: Results, Decisions).

Every weight of two or more dimensions with more than one output row takes Muon, seen as the
matrix (outputs, everything else); biases and one-output layers take AdamW. The Muon step is
scaled to AdamW's update size (torch's adjust_lr_fn="match_rms_adamw"), so one `lr`,
`weight_decay` and schedule serve both. The step is torch.optim.Muon's but for two things,
both so that an effective batch's split stays a memory and speed choice (docs: Concepts, The
training step): the Newton-Schulz iteration runs in float32, not bf16; and where the
gradients are computed in half precision, it does not lift a direction weaker than their
rounding (a floor: `floor_of`). tests/test_muon.py checks it against torch's.
"""

import math

import torch
from torch import nn

from rul.training.precision import DTYPES

# torch.optim.Muon's defaults (torch/optim/_muon.py)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7
MOMENTUM = 0.95
# The floor under the singular values the iteration lifts, in units of bf16's rounding
# (torch.finfo(torch.bfloat16).eps) times the update's norm: well above the difference two
# splits of one batch make in either half precision. One floor for both, bf16's: fp16's own
# eps held its splits only on some draws (docs: Concepts, Precision; Results, Decisions).
FLOOR_EPS = 25.0


def floor_of(precision: str) -> float:
    """The floor for gradients computed in `precision`: the same for fp16 and bf16, the update
    Muon takes then one function of the gradient (fp32: none, the iteration as ever)."""
    return FLOOR_EPS * torch.finfo(torch.bfloat16).eps if precision in DTYPES else 0.0


def takes_muon(parameter: torch.Tensor) -> bool:
    """A weight matrix (or filters seen as one) with more than one row and column."""
    return parameter.ndim >= 2 and parameter.shape[0] > 1 and parameter[0].numel() > 1


def orthogonalized(update: torch.Tensor, steps: int = NS_STEPS,
                   dtype: torch.dtype = torch.float32, floor: float = 0.0) -> torch.Tensor:
    """The Newton-Schulz approximation of U V^T for update = U S V^T (a 2D tensor), as
    torch.optim.Muon computes it (which does so in bf16: dtype=torch.bfloat16). With a
    `floor` c > 0: U f(S) V^T with f(s) = s / sqrt(s^2 + (c |update|)^2), the iteration run on
    [update, c |update| I], whose left block that is: a direction far above the floor moves as
    Muon moves it, one at the floor's level is damped, not lifted."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(dtype)
    wide = update.size(0) <= update.size(1)
    if not wide:
        x = x.T
    columns = x.size(1)
    if floor:
        x = torch.cat([x, torch.eye(x.size(0), dtype=dtype, device=x.device)
                       .mul_(floor * x.norm())], dim=1)
    x.div_(x.norm().clamp(min=EPS))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x[:, :columns]
    return x if wide else x.T


def muon_adamw(model: nn.Module, settings, on_device: bool) -> "MuonAdamW":
    """OPTIMIZER_KINDS' builder (rul.training.optimizers): the floor follows the precision the
    gradients are computed in; `on_device`: the step decides there (MuonAdamW)."""
    return MuonAdamW(model, lr=settings.lr, weight_decay=settings.weight_decay,
                     floor=floor_of(settings.precision), on_device=on_device)


class MuonAdamW(torch.optim.AdamW):
    """torch's AdamW whose matrix groups (`muon: True`) step by Muon instead; every group
    shares lr and weight_decay, which the schedule sets as for AdamW. State dicts are
    AdamW's, the matrices holding a `step` and a `momentum_buffer` each.

    `on_device` (sync-free, CUDA: optim.make_optimizer): its rate a float64 tensor on the
    model's device (the host's rate, bit for bit), its state there, and it takes the skip
    decision as GradScaler passes it to a fused optimizer (`found_inf`): it computes the
    host's step with tensors and keeps every tensor it moved as it was where found_inf is
    set, so nothing reads a value back and a CUDA graph can capture the step."""

    ns_dtype = torch.float32  # of the Newton-Schulz iteration (torch.optim.Muon's: bfloat16)

    def __init__(self, model: nn.Module, lr: float, weight_decay: float = 0.0,
                 floor: float = 0.0, on_device: bool = False):
        matrices = [p for p in model.parameters() if takes_muon(p)]
        others = [p for p in model.parameters() if not takes_muon(p)]
        muon = {"params": matrices, "muon": True, "momentum": MOMENTUM}
        if floor:  # a checkpoint of a run without one keeps its groups as they were
            muon["floor"] = floor
        if on_device:
            lr = torch.tensor(lr, dtype=torch.float64, device=next(model.parameters()).device)
        super().__init__([muon, {"params": others, "muon": False}], lr=lr,
                         weight_decay=weight_decay, capturable=on_device)
        self.on_device = self._step_supports_amp_scaling = on_device

    @torch.no_grad()
    def step(self, closure=None):
        """One step; `closure` (as torch's optimizers take it: Lightning passes one) computes
        the loss and its gradients first, and its loss is returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.on_device:
            self._step_on_device()
            return loss
        stepped = []
        for group in self.param_groups:
            if group["muon"]:
                for p in group["params"]:
                    if p.grad is not None:
                        self._state_of(p, group)
                        self._muon_step(p, group)
                        stepped.append((p, p.grad))
                        p.grad = None  # AdamW's step passes over a tensor without a gradient
        try:
            super().step()
        finally:
            for p, grad in stepped:
                p.grad = grad
        return loss

    def _step_on_device(self) -> None:
        """Every group's step as the host takes it, each tensor it moves (the weight and its
        state) then kept as it was where `found_inf` is set (GradScaler.step sets it, or
        step._step_on_device without a scaler; absent: the step is taken)."""
        if getattr(self, "grad_scale", None) is not None:
            raise ValueError("MuonAdamW steps unscaled gradients: GradScaler.unscale_ first")
        found_inf = getattr(self, "found_inf", None)
        skip = None if found_inf is None else found_inf > 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                moved = [p, *self._state_of(p, group).values()]
                before = [t.clone() for t in moved] if skip is not None else []
                (self._muon_step if group["muon"] else self._adamw_step)(p, group)
                for tensor, was in zip(moved, before):
                    tensor.copy_(torch.where(skip, was, tensor))

    def _state_of(self, p: torch.Tensor, group: dict) -> dict:
        """`p`'s state, created on its first step as AdamW creates it (its step count on the
        host, or on the device with the rate there)."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, device=p.device if self.on_device else None)
            like = p.grad.reshape(p.shape[0], -1) if group["muon"] else p
            for key in ("momentum_buffer",) if group["muon"] else ("exp_avg", "exp_avg_sq"):
                state[key] = torch.zeros_like(like, memory_format=torch.preserve_format)
        return state

    def _muon_step(self, p: torch.Tensor, group: dict) -> None:
        grad = p.grad.reshape(p.shape[0], -1)
        state = self.state[p]
        state["step"] += 1
        buf, momentum = state["momentum_buffer"], group["momentum"]
        buf.lerp_(grad, 1 - momentum)
        update = orthogonalized(grad.lerp(buf, momentum), dtype=self.ns_dtype,
                                floor=group.get("floor", 0.0))
        lr = _rate(group)
        p.mul_(1 - lr * group["weight_decay"])
        _add_scaled(p, update.view(p.shape), -lr * 0.2 * math.sqrt(max(grad.shape)))

    def _adamw_step(self, p: torch.Tensor, group: dict) -> None:
        """torch.optim.AdamW's step of one tensor as a host takes it (its single-tensor
        formula, not the capturable one, which rounds apart), its numbers 0-dim tensors."""
        state, grad, lr = self.state[p], p.grad, group["lr"]
        beta1, beta2 = group["betas"]
        state["step"] += 1
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = state["step"].double()
        step_size = lr / (1 - beta1 ** step)
        # the host's `** 0.5` (C's pow) and this sqrt round to one float32, which the division
        # takes, at every step count below 200,000
        root = (1 - beta2 ** step).sqrt()
        denom = (state["exp_avg_sq"].sqrt() / root).add_(group["eps"])
        p.addcdiv_(state["exp_avg"] * -step_size, denom)


def _rate(group: dict) -> float | torch.Tensor:
    """The group's rate: a number on the host, a 0-dim tensor when the device decides."""
    lr = group["lr"]
    return lr if isinstance(lr, torch.Tensor) else float(lr)


def _add_scaled(p: torch.Tensor, update: torch.Tensor, alpha: float | torch.Tensor) -> None:
    """p += alpha x update; a 0-dim tensor alpha by addcmul, which on a CPU rounds as add
    with the host's number does (one fused multiply-add: tests/test_muon.py)."""
    if isinstance(alpha, torch.Tensor):
        p.addcmul_(update, alpha)
    else:
        p.add_(update, alpha=alpha)

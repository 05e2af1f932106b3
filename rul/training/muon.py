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

# torch.optim.Muon's defaults (torch/optim/_muon.py)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7
MOMENTUM = 0.95
# The floor under the singular values the iteration lifts, in units of the gradients' own
# rounding (torch.finfo(dtype).eps) times the update's norm: well above the difference two
# splits of one batch make in half precision (docs: Concepts, The training step).
FLOOR_EPS = 25.0
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def floor_of(precision: str) -> float:
    """The floor for gradients computed in `precision` (fp32: none, the iteration as ever)."""
    return FLOOR_EPS * torch.finfo(HALF[precision]).eps if precision in HALF else 0.0


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
    """OPTIMIZER_KINDS' builder (rul.training.optimizers): the host decides each step; the
    floor follows the precision the gradients are computed in."""
    return MuonAdamW(model, lr=settings.lr, weight_decay=settings.weight_decay,
                     floor=floor_of(settings.precision))


class MuonAdamW(torch.optim.AdamW):
    """torch's AdamW whose matrix groups (`muon: True`) step by Muon instead; every group
    shares lr and weight_decay, which the schedule sets as for AdamW. State dicts are
    AdamW's, the matrices holding a `step` and a `momentum_buffer` each."""

    ns_dtype = torch.float32  # of the Newton-Schulz iteration (torch.optim.Muon's: bfloat16)

    def __init__(self, model: nn.Module, lr: float, weight_decay: float = 0.0,
                 momentum: float = MOMENTUM, floor: float = 0.0):
        matrices = [p for p in model.parameters() if takes_muon(p)]
        others = [p for p in model.parameters() if not takes_muon(p)]
        muon = {"params": matrices, "muon": True, "momentum": momentum}
        if floor:  # a checkpoint of a run without one keeps its groups as they were
            muon["floor"] = floor
        super().__init__([muon, {"params": others, "muon": False}], lr=lr,
                         weight_decay=weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        stepped = []
        for group in self.param_groups:
            if group["muon"]:
                for p in group["params"]:
                    if p.grad is not None:
                        self._muon_step(p, group)
                        stepped.append((p, p.grad))
                        p.grad = None  # AdamW's step passes over a tensor without a gradient
        try:
            super().step()
        finally:
            for p, grad in stepped:
                p.grad = grad

    def _muon_step(self, p: torch.Tensor, group: dict) -> None:
        grad = p.grad.reshape(p.shape[0], -1)
        state = self.state[p]
        if "momentum_buffer" not in state:  # and a step count, which AdamW's loading expects
            state["step"] = torch.tensor(0.0)
            state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        state["step"] += 1
        buf, momentum = state["momentum_buffer"], group["momentum"]
        buf.lerp_(grad, 1 - momentum)
        update = orthogonalized(grad.lerp(buf, momentum), dtype=self.ns_dtype,
                                floor=group.get("floor", 0.0))
        lr = float(group["lr"])
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.view(p.shape), alpha=-lr * 0.2 * math.sqrt(max(grad.shape)))

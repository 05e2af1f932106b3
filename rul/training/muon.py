"""Muon for the network's weight matrices and AdamW for the rest, as one optimizer
(`optimizer: muon`).

Muon (Jordan et al. 2024; torch.optim.Muon) moves each weight matrix along the semi-orthogonal
matrix nearest its Nesterov momentum, found by a few Newton-Schulz iterations: every direction
of the matrix moves at one rate, where Adam lets the few largest directions of a gradient
dominate its step. It takes fewer steps to the same loss, which is what a large effective
batch lacks: `make train`'s DCNN leaves AdamW's early validation plateau (RMSE ~15 for 20-40
epochs at batch 512) within its first ten epochs (docs: Results).

Which tensors take Muon: every weight of two or more dimensions with more than one output row,
seen as the matrix (outputs, everything else): a convolution's filters as in Jordan's CIFAR-10
runs, a dense layer as it is. Biases and one-output layers (the DCNN's last convolution, the
head's output) take AdamW. The Muon step is scaled to AdamW's update size (Moonshot's rule,
0.2 sqrt(max(rows, columns)), torch's adjust_lr_fn="match_rms_adamw"), so one `lr`,
`weight_decay` and schedule serve both kinds of group.

The matrices' step is torch.optim.Muon's (its coefficients and momentum as a lerp), which only
takes two-dimensional parameters, with one difference: the Newton-Schulz iteration runs in
float32, where torch's runs in bf16. The iteration lifts a gradient's small singular directions
to the size of the large ones, so bf16's rounding of its input (3 significant digits) turned the
float32 rounding by which two splits of one effective batch differ (256 x 2 against 512 x 1)
into weights 6e-3 apart after one epoch; in float32 they agree as AdamW's do (1e-5), and an
effective batch's split stays a memory and speed choice. The matrices are small (the DCNN's
largest is 100 x 420): the cost is nothing measurable. tests/test_muon.py checks that the step
agrees with torch.optim.Muon's on a matrix (to bf16's rounding; bit for bit with a bf16
iteration), and that the other tensors step as torch's AdamW bit for bit.
"""

import math

import torch
from torch import nn

# torch.optim.Muon's defaults (torch/optim/_muon.py)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7
MOMENTUM = 0.95


def takes_muon(parameter: torch.Tensor) -> bool:
    """A weight matrix (or filters seen as one) with more than one row and column."""
    return parameter.ndim >= 2 and parameter.shape[0] > 1 and parameter[0].numel() > 1


def orthogonalized(update: torch.Tensor, steps: int = NS_STEPS,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The Newton-Schulz approximation of U V^T for update = U S V^T (a 2D tensor), as
    torch.optim.Muon computes it (which does so in bf16: dtype=torch.bfloat16)."""
    a, b, c = NS_COEFFICIENTS
    x = update.to(dtype)
    wide = update.size(0) <= update.size(1)
    if not wide:
        x = x.T
    x.div_(x.norm().clamp(min=EPS))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


class MuonAdamW(torch.optim.AdamW):
    """torch's AdamW whose matrix groups (`muon: True`) step by Muon instead; every group
    shares lr and weight_decay, which the schedule sets as for AdamW. State dicts are
    AdamW's, the matrices holding a `step` and a `momentum_buffer` each."""

    ns_dtype = torch.float32  # of the Newton-Schulz iteration (torch.optim.Muon's: bfloat16)

    def __init__(self, model: nn.Module, lr: float, weight_decay: float = 0.0,
                 momentum: float = MOMENTUM):
        matrices = [p for p in model.parameters() if takes_muon(p)]
        others = [p for p in model.parameters() if not takes_muon(p)]
        super().__init__([{"params": matrices, "muon": True, "momentum": momentum},
                          {"params": others, "muon": False}],
                         lr=lr, weight_decay=weight_decay)

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
        update = orthogonalized(grad.lerp(buf, momentum), dtype=self.ns_dtype)
        lr = float(group["lr"])
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.view(p.shape), alpha=-lr * 0.2 * math.sqrt(max(grad.shape)))

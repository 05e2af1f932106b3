"""Dropout whose mask is cheap to draw on a CPU.

nn.Dropout draws its mask with `bernoulli_`, which on CPUs without MKL's vendor path (AMD's
among them) runs PyTorch's scalar loop: one double from the Mersenne Twister per element, about
1.1 ms for the DCNN head's 256 x 450 activations, ~7 % of its bf16 training step
(docs: Performance; on Intel CPUs bernoulli_ takes MKL's path, not measured here). The same
Bernoulli(1 - p) mask, drawn from the same generator (so the same seeding, checkpoints and
resume), costs a fraction of that:

- p = 0.5 (the DCNN's default): each random 16-bit word gives 16 fair coins, its bits
  (torch.randint over [0, 2^16) is exactly uniform: 2^16 divides the generator's 2^32);
  ~50 us for the whole mask.
- any other p: uniform floats compared with p (`torch.rand(...) >= p`, 24-bit resolution),
  ~250 us.

Kept elements are scaled by 1 / (1 - p), as nn.Dropout does. The masks are other draws than
`bernoulli_`'s, so a seed trains another (equally likely) network than with nn.Dropout. Off a
CPU, in eval mode, for p = 0 or 1, and for stacked members (rul.models.stacking: vmap draws
each member's mask), it is nn.Dropout (CUDA's fused kernel is already fast).
"""

import math

import torch
from torch import nn

from rul.models.stacking import inside_vmap

_BITS = torch.arange(16, dtype=torch.int32)  # the bit positions of a 16-bit word


def keep_mask(shape: torch.Size, p: float, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of `shape`: 1 / (1 - p) with probability 1 - p, else 0.

    Drawn row by row along the first (batch) dimension, each row from whole words: the mask
    of a batch is the masks of its parts one after the other, however it is split into
    micro-batches (as with bernoulli_'s scalar path), so the effective batch alone decides the
    training."""
    if shape.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    rows, per_row = (shape[0], math.prod(shape[1:])) if len(shape) else (1, 1)
    if p == 0.5:
        words = torch.randint(0, 1 << 16, (rows, (per_row + 15) // 16, 1), dtype=torch.int32)
        keep = ((words >> _BITS) & 1).view(rows, -1)[:, :per_row]
    else:
        keep = torch.rand(rows, per_row) >= p
    return keep.to(dtype).mul_(1 / (1 - p)).reshape(shape)


class CheapMaskDropout(nn.Dropout):
    """nn.Dropout with its mask drawn by `keep_mask` on CPU (same parameters: none)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p in (0, 1) or not x.is_cpu or inside_vmap(x):
            return super().forward(x)
        mask = keep_mask(x.shape, self.p, x.dtype)
        return x.mul_(mask) if self.inplace else x * mask

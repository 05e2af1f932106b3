"""The DCNN's time convolutions as one matrix product each: a candidate path for GPUs, off by
default (DCNN.unfolded) until `make gpu-check` has timed it against cuDNN.

On an H200 the default recipe's step spends most of its kernel time in cuDNN's convolutions
of the (10, 1) kernels with 10 channels, 30-40 us each for about 10 MFLOP a layer (gpu-check's
profile section). As im2col, a layer over N sequences of T steps is one (N x T, C_in x k) @
(C_in x k, C_out) product with its bias: `unfold` gathers each output step's k input steps of
every channel (a view, copied once for the product), and its backward sums them back. The
numbers are the convolution's up to float rounding (another order of the sums); the
parameters are the TimeConv layers' own, so state dicts do not change. Activations stay
time-major with channels last, (N, T, C), each sensor's window one sequence, as the banded
CPU path (banded.py) lays them out.
"""

import torch
from torch.nn import functional

from rul.models.banded import offset


def unfolded_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  kernel_size: int) -> torch.Tensor:
    """TimeConv along the steps of `x` (N, T, C_in) with its "same" padding and trim:
    (N, T, C_out), from the layer's (C_out, C_in, k, 1) `weight` and `bias`."""
    n, length, c_in = x.shape
    c_out = weight.shape[0]
    before = -offset(kernel_size)  # TimeConv pads k // 2 and drops an even kernel's extra step
    padded = functional.pad(x, (0, 0, before, kernel_size - 1 - before))
    patches = padded.unfold(1, kernel_size, 1)  # (N, T, C_in, k)
    out = functional.linear(patches.reshape(n * length, c_in * kernel_size),
                            weight.reshape(c_out, c_in * kernel_size), bias)
    return out.view(n, length, c_out)

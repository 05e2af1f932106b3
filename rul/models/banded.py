"""The DCNN's time convolutions as banded matrix products: its fast path on CPUs.

A (k, 1) "same" convolution along time maps each sensor's sequence, one row of T x C_in values
(time-major, channels last), to a row of T x C_out through a banded (block-Toeplitz) matrix M:
M[(s, ci), (t, co)] = W[co, ci, s - t - off] where 0 <= s - t - off < k (off = -(k // 2), +1
for an even kernel: TimeConv's padding and trim). A layer over a batch is then x @ M, which BLAS
runs far faster than a direct convolution with so few channels (docs: Performance).

M is mostly zeros, so it is cut into blocks of output steps: block [t0, t1) needs only the
input steps [t0 + off, t1 + off + k - 1), clipped to the window. Each layer's tanh is fused in
(as 2 sigmoid(2z) - 1, the 2 folded into M); the backward computes the input gradient block by
block and the kernel's gradient by one index_add. The numbers are the convolution's up to
float32 rounding; the parameters (and state dicts) are the TimeConv's own.
"""

from functools import lru_cache

import torch
from torch.autograd.function import once_differentiable

# Output steps per block: about this many output values (steps x C_out) per block row (the
# default DCNN's 10-channel layers: blocks of 5 steps).
BLOCK_WIDTH = 48


def offset(kernel_size: int) -> int:
    """Input step of a layer's output step 0 at kernel tap 0 (TimeConv's "same" padding)."""
    return -(kernel_size // 2) + (1 - kernel_size % 2)


def _block_bounds(length: int, block: int) -> list[tuple[int, int]]:
    count = max(1, round(length / block))
    edges = [round(i * length / count) for i in range(count + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _band_index(c_in: int, c_out: int, k: int, rows: range, columns: range) -> torch.Tensor:
    """Indices into [W.flatten(), 0] of M's `rows` (time steps s) x `columns` (time steps
    t); the padding index (the appended 0) outside the band."""
    cpu = torch.device("cpu")  # whatever torch.set_default_device says: the path is CPU-only
    s = torch.arange(rows.start, rows.stop, device=cpu).view(-1, 1, 1, 1)
    ci = torch.arange(c_in, device=cpu).view(1, -1, 1, 1)
    t = torch.arange(columns.start, columns.stop, device=cpu).view(1, 1, -1, 1)
    co = torch.arange(c_out, device=cpu).view(1, 1, 1, -1)
    tap = s - t - offset(k)
    inside = (tap >= 0) & (tap < k)
    flat = torch.where(inside, (co * c_in + ci) * k + tap.clamp(0, k - 1), c_out * c_in * k)
    return flat.reshape(len(rows) * c_in, len(columns) * c_out)


class BandPlan:
    """How one layer's product is blocked, for sequences of `length` steps: forward, (input
    columns, output columns) per block of output steps and the index that builds all blocks of
    M at once; backward, the same per block of input steps for M's transpose."""

    def __init__(self, length: int, c_in: int, c_out: int, k: int):
        self.length, self.c_in, self.c_out, self.k = length, c_in, c_out, k
        block = max(1, min(length, -(-BLOCK_WIDTH // c_out)))
        off = offset(k)
        self.forward, forward_index = [], []
        for t0, t1 in _block_bounds(length, block):
            s0, s1 = max(0, t0 + off), min(length, t1 - 1 + off + k)
            self.forward.append((slice(s0 * c_in, s1 * c_in), slice(t0 * c_out, t1 * c_out),
                                 ((s1 - s0) * c_in, (t1 - t0) * c_out)))
            forward_index.append(
                _band_index(c_in, c_out, k, range(s0, s1), range(t0, t1)).reshape(-1))
        self.backward, backward_index = [], []
        for s0, s1 in _block_bounds(length, block):
            t0, t1 = max(0, s0 - off - k + 1), min(length, s1 - off)
            self.backward.append((slice(t0 * c_out, t1 * c_out), slice(s0 * c_in, s1 * c_in),
                                  ((t1 - t0) * c_out, (s1 - s0) * c_in)))
            backward_index.append(
                _band_index(c_in, c_out, k, range(s0, s1), range(t0, t1)).t().reshape(-1))
        self.forward_index = torch.cat(forward_index)
        self.backward_index = torch.cat(backward_index)


@lru_cache(maxsize=64)
def band_plan(length: int, c_in: int, c_out: int, k: int) -> BandPlan:
    return BandPlan(length, c_in, c_out, k)


def _blocks(flat: torch.Tensor, shapes) -> list[torch.Tensor]:
    """Split the gathered values of all blocks into the blocks' matrices (views)."""
    sizes = [rows * cols for rows, cols in shapes]
    return [part.view(shape) for part, shape in zip(flat.split(sizes), shapes, strict=True)]


class _BandedTanh(torch.autograd.Function):
    """tanh(x @ M(weight) + bias) for x (sequences, length x C_in), one call per layer."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                plan: BandPlan) -> torch.Tensor:
        padded = torch.cat([weight.reshape(-1), weight.new_zeros(1)])  # (co, ci, tap) order
        twice = _blocks(padded[plan.forward_index].mul_(2), [s for *_, s in plan.forward])
        bias_row = (bias * 2).repeat(plan.length)
        out = x.new_empty((x.shape[0], plan.length * plan.c_out))
        for (rows, cols, _), m in zip(plan.forward, twice, strict=True):
            torch.addmm(bias_row[cols], x[:, rows], m, out=out[:, cols])  # 2 z
        torch.sigmoid(out, out=out)  # tanh(z) = 2 sigmoid(2 z) - 1 (see cnn.tanh_into)
        torch.add(out.new_full((), -1.0), out, alpha=2, out=out)
        ctx.save_for_backward(x, weight, out)
        ctx.plan = plan
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        x, weight, out = ctx.saved_tensors
        plan = ctx.plan
        grad_z = torch.ops.aten.tanh_backward(grad_out, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            padded = torch.cat([weight.reshape(-1), weight.new_zeros(1)])
            grad_x = torch.empty_like(x)
            transposed = _blocks(padded[plan.backward_index], [s for *_, s in plan.backward])
            for (cols, rows, _), m in zip(plan.backward, transposed, strict=True):
                torch.mm(grad_z[:, cols], m, out=grad_x[:, rows])
        if ctx.needs_input_grad[1]:
            grad_m = torch.cat([torch.mm(x[:, rows].t(), grad_z[:, cols]).view(-1)
                                for rows, cols, _ in plan.forward])
            grad_padded = weight.new_zeros(weight.numel() + 1).index_add_(
                0, plan.forward_index, grad_m)
            # in the weight's own layout (channels_last in the DCNN): DDP's buckets and
            # autograd's accumulation expect a parameter's gradient strided as the parameter
            grad_weight = torch.empty_like(weight).copy_(grad_padded[:-1].view(weight.shape))
        if ctx.needs_input_grad[2]:
            grad_bias = grad_z.sum(0).view(plan.length, plan.c_out).sum(0)
        return grad_x, grad_weight, grad_bias, None


def banded_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                kernel_size: int) -> torch.Tensor:
    """One DCNN layer, tanh(TimeConv(x)) with the TimeConv's (C_out, C_in, k, 1) `weight`, on x
    (sequences, length x C_in) time-major, channels last; returns (sequences, length x C_out)."""
    c_out, c_in = weight.shape[:2]
    if x.dim() != 2 or x.shape[1] % c_in:
        raise ValueError(f"banded_tanh expects (sequences, length x {c_in}), got shape "
                         f"{tuple(x.shape)}")
    if weight.shape[2:] not in ((kernel_size, 1), (kernel_size,)):
        raise ValueError(f"banded_tanh expects a ({c_out}, {c_in}, {kernel_size}, 1) weight, "
                         f"got shape {tuple(weight.shape)}")
    plan = band_plan(x.shape[1] // c_in, c_in, c_out, kernel_size)
    return _BandedTanh.apply(x.contiguous(), weight, bias, plan)

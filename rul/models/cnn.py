"""1D-CNN over the window in the style of Li, Ding & Sun (2018), "Remaining useful life
estimation in prognostics using deep convolution neural networks" (DCNN).

Convolutions run along time only (kernel (k, 1)), so each sensor keeps its own column until the
fully connected layer. No BatchNorm (it would break accumulated == large-batch equivalence).
The same layers run as banded matrix products on a CPU in float32 (banded.py), elsewhere as
channels_last convolutions with each even-kernel trim fused into its tanh (docs: Performance).
"""

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from rul.models.banded import banded_tanh
from rul.models.dropout import CheapMaskDropout
from rul.models.stacking import inside_vmap
from rul.models.unfolded import unfolded_conv


class TimeConv(nn.Conv2d):
    """A (k, 1) convolution along time with "same" output length, padded k//2 on both sides
    and an even kernel's extra leading step dropped: padding="same"'s numbers without its copy
    and warning, and nn.Conv2d's parameters (same state dicts)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 trim: bool = True):
        super().__init__(in_channels, out_channels, (kernel_size, 1),
                         padding=(kernel_size // 2, 0))
        self.trim = (1 - kernel_size % 2) if trim else 0  # an even kernel: one extra step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out[:, :, self.trim:] if self.trim else out


def tanh_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = tanh(x): on CPU as 2 sigmoid(2x) - 1 in float32 (faster; within 2e-7, not bit for
    bit), bfloat16 through a float32 copy rounded once (in bf16 small values would round to 0
    or +-2^-7); elsewhere torch.tanh (docs: Performance)."""
    if not x.is_cpu or x.dtype not in (torch.float32, torch.bfloat16):
        return torch.tanh(x, out=out)
    if x.dtype == torch.float32:
        torch.mul(x, 2, out=out)
        torch.sigmoid(out, out=out)
        return out.mul_(2).sub_(1)
    work = x.float().mul_(2)
    torch.sigmoid(work, out=work)
    return out.copy_(work.mul_(2).sub_(1))


class _TrimmedTanh(torch.autograd.Function):
    """tanh(x[:, :, trim:]) without the copies autograd makes around a slice: written straight
    into a tensor of the input's layout, its gradient straight into the slice of the input's
    (docs: Performance; tests/test_dcnn.py). Not twice differentiable."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, trim: int, exact: bool) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"TrimmedTanh expects (batch, channels, time, features), got "
                             f"shape {tuple(x.shape)}")
        layout = (torch.channels_last if x.is_contiguous(memory_format=torch.channels_last)
                  else torch.contiguous_format)
        kept = x[:, :, trim:]
        out = torch.empty(kept.shape, dtype=x.dtype, device=x.device, memory_format=layout)
        if exact:
            torch.tanh(kept, out=out)
        else:
            tanh_into(kept, out)
        ctx.save_for_backward(out)
        ctx.trim, ctx.layout = trim, layout
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        (out,) = ctx.saved_tensors
        n, c, length, width = out.shape
        grad = torch.empty((n, c, length + ctx.trim, width), dtype=grad_out.dtype,
                           device=grad_out.device, memory_format=ctx.layout)
        grad[:, :, :ctx.trim].zero_()
        torch.ops.aten.tanh_backward.grad_input(grad_out, out, grad_input=grad[:, :, ctx.trim:])
        return grad, None, None


class TrimmedTanh(nn.Module):
    """tanh of a TimeConv(trim=False)'s output less an even kernel's extra leading step; `exact`:
    torch.tanh on every device, bit for bit slicing then nn.Tanh (not a config key)."""

    def __init__(self, kernel_size: int, exact: bool = False):
        super().__init__()
        self.trim, self.exact = 1 - kernel_size % 2, exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if inside_vmap(x):  # stacked members: the exact path's operators, which vmap batches
            return torch.tanh(x[:, :, self.trim:])
        return _TrimmedTanh.apply(x, self.trim, self.exact)

    def extra_repr(self) -> str:
        return f"trim={self.trim}, exact={self.exact}"


class DCNN(nn.Module):
    def __init__(self, shape: tuple[int, int], filters: int = 10, kernel_size: int = 10,
                 num_layers: int = 4, hidden_size: int = 100, dropout: float = 0.5):
        """`shape`: (features, window) of its input windows."""
        super().__init__()
        n_features, window = shape
        layers, channels = [], 1
        for _ in range(num_layers):
            layers += [TimeConv(channels, filters, kernel_size, trim=False),
                       TrimmedTanh(kernel_size)]
            channels = filters
        layers += [TimeConv(channels, 1, 3), nn.Tanh()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), CheapMaskDropout(dropout), nn.Linear(window * n_features, hidden_size),
            nn.Tanh(), nn.Linear(hidden_size, 1),
        )
        for module in self.modules():
            if isinstance(module, nn.Conv2d | nn.Linear):
                nn.init.xavier_normal_(module.weight)
                nn.init.zeros_(module.bias)
        # channels_last weights take oneDNN's fast path (docs: Performance); the banded path
        # reads the same weights in any layout.
        self.features.to(memory_format=torch.channels_last)

    # The banded-product path on CPUs in float32, eager (False: always the convolutions, which
    # torch.compile and stacked members take anyway). Not a config key: both compute the same
    # network.
    banded = True
    # The convolutions as one matrix product each (unfolded.py) wherever the banded path does
    # not run: off until `make gpu-check` times it on a GPU (its recipe section's last row).
    unfolded = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, window, features) -> (B,)
        weight = self.features[0].weight
        if self.banded and x.device.type == weight.device.type == "cpu" \
                and x.dtype == weight.dtype == torch.float32 \
                and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling() \
                and not inside_vmap(weight):
            features = self._banded_features(x)
        elif self.unfolded and not inside_vmap(weight):
            features = self._unfolded_features(x)
        else:
            features = self.features(x.unsqueeze(1))
        return self.head(features).squeeze(-1)

    def _layers(self, path: str) -> list[tuple[TimeConv, nn.Module]]:
        """The (convolution, tanh) pairs of the features, which the banded and unfolded
        paths compute by hand."""
        pairs = list(zip(self.features[::2], self.features[1::2], strict=True))
        for conv, tanh in pairs:
            if not (isinstance(conv, TimeConv) and isinstance(tanh, TrimmedTanh | nn.Tanh)):
                raise TypeError(f"DCNN.{path}: features must alternate TimeConv and tanh, got "
                                f"{type(conv).__name__}, {type(tanh).__name__}; set {path} = "
                                "False for other layers")
        return pairs

    def _banded_features(self, x: torch.Tensor) -> torch.Tensor:
        """self.features(x.unsqueeze(1)) flattened, as banded products: each sensor's window
        is one row (time-major, channels last) through every layer."""
        batch, length, width = x.shape
        rows = x.transpose(1, 2).reshape(batch * width, length)
        for conv, _ in self._layers("banded"):
            rows = banded_tanh(rows, conv.weight, conv.bias, conv.kernel_size[0])
        # (B x F, length) -> the convolutions' flattened (B, 1, length, F) order
        return rows.view(batch, width, length).transpose(1, 2).reshape(batch, length * width)

    def _unfolded_features(self, x: torch.Tensor) -> torch.Tensor:
        """self.features(x.unsqueeze(1)) flattened, each layer one matrix product: each
        sensor's window one sequence (time-major, channels last) through every layer."""
        batch, length, width = x.shape
        rows = x.transpose(1, 2).reshape(batch * width, length, 1)
        for conv, _ in self._layers("unfolded"):
            rows = torch.tanh(unfolded_conv(rows, conv.weight, conv.bias, conv.kernel_size[0]))
        return rows.view(batch, width, length).transpose(1, 2).reshape(batch, length * width)

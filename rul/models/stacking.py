"""Whether a layer runs as one member of several stacked networks (torch.func.vmap).

Members of one architecture train at once with their weights stacked
(rul.training.stacked): each layer then sees one member's slice, a tensor that vmap batches.
The layers that compute by hand on a CPU (the DCNN's banded products and fused trim + tanh,
the cheap dropout masks) take PyTorch's plain operators there instead: vmap batches those,
and they compute the same function (within float rounding; dropout draws other masks).
"""

import torch


def inside_vmap(x: torch.Tensor) -> bool:
    """Whether `x` is one member's slice inside torch.func.vmap."""
    return torch._C._functorch.is_batchedtensor(x)

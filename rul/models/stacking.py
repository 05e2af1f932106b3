"""Members of one architecture as one network (StackedNetwork), and whether a layer runs as
one member of it (torch.func.vmap).

Members of one architecture train at once with their weights stacked
(rul.training.stacked): each layer then sees one member's slice, a tensor that vmap batches.
The layers that compute by hand on a CPU (the DCNN's banded products and fused trim + tanh,
the cheap dropout masks) take PyTorch's plain operators there instead: vmap batches those,
and they compute the same function (within float rounding; dropout draws other masks).
"""

import copy

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap


def inside_vmap(x: torch.Tensor) -> bool:
    """Whether `x` is one member's slice inside torch.func.vmap."""
    return torch._C._functorch.is_batchedtensor(x)


MEMBER_INPUT_DIMS = 3  # a member's input: (batch, window, features)


class StackedNetwork(nn.Module):
    """Networks of one architecture as one module: each parameter the members' stacked along
    a first dimension (torch.func.stack_module_state), a call vmapped over them. Its input is
    one batch per member, (members, batch, ...), or one batch for all, (batch, ...); its
    output (members, batch). The training step needs to know nothing more of it than
    `members` (rul.training.step: each member's own loss and gradient clipping); its
    optimizer, schedule and weight average are elementwise, so each member's slice moves as
    that member alone would. Buffers (the output scale) are the config's, the same for every
    member: not stacked."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        stacked, _ = stack_module_state(models)
        self.members = len(models)
        self.names = list(stacked)  # the members' own parameter names, in order
        for index, tensor in enumerate(stacked.values()):
            self.register_parameter(f"stacked_{index}", nn.Parameter(tensor.detach()))
        for name, buffer in models[0].named_buffers():
            self.register_buffer(name.replace(".", "__"), buffer.detach().clone())
        # the architecture, no storage: kept out of the module's registry, so that .to(),
        # state_dict() and the weight average see the stacked weights only
        object.__setattr__(self, "base", copy.deepcopy(models[0]).to("meta"))

    def stacked(self) -> dict[str, torch.Tensor]:
        """The stacked parameters under the members' own names."""
        return {name: getattr(self, f"stacked_{i}") for i, name in enumerate(self.names)}

    def shared_buffers(self) -> dict[str, torch.Tensor]:
        return {name.replace("__", "."): buffer for name, buffer in self.named_buffers()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def member(parameters, buffers, x):
            return functional_call(self.base, (parameters, buffers), (x,))

        self.base.train(self.training)
        shared = x.dim() == MEMBER_INPUT_DIMS  # one batch for all members
        return vmap(member, in_dims=(0, None, None if shared else 0),
                    randomness="different")(self.stacked(), self.shared_buffers(), x)

    def member_state(self, index: int) -> dict[str, torch.Tensor]:
        """Member `index`'s weights as its network's state dict."""
        return {**{name: t[index].detach().clone() for name, t in self.stacked().items()},
                **{name: b.clone() for name, b in self.shared_buffers().items()}}

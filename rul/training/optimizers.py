"""The optimizers `optimizer:` names, one row each: how it is built and what it can do. The
config's allowed values, the step's device path, stacking, resume and the CUDA graph read the
row; tests/test_optimizer_kinds.py runs every row through a step, a resume, a split and a
stack, and fails where a declared ability disagrees with what the optimizer does. Imports no
torch: a row names its builder, imported on the first build.

To add an optimizer: its builder (model, OptimizerSettings, on_device) -> torch optimizer in a
module of rul/training/, and its row here.
"""

import importlib
from dataclasses import dataclass

# A parameter group's keys that say how an optimizer computes, not what it learned: a resumed
# run keeps its own (a checkpoint moves between a CPU run and a CUDA run).
HOW_IT_COMPUTES = ("fused", "capturable", "foreach", "differentiable")


@dataclass(frozen=True)
class OptimizerKind:
    builder: str  # "module.function": (model, settings, on_device) -> torch.optim.Optimizer
    elementwise: bool  # each weight's update reads its own gradient only: stacked members
    # (one tensor per parameter, members along its first dimension) step as each alone
    on_device: bool  # on CUDA it takes its rate and the skip decision as tensors (no sync)
    capturable: bool  # its on-device step replays from a CUDA graph
    kept_on_resume: tuple[str, ...] = HOW_IT_COMPUTES  # its groups' keys a resume keeps

    def build(self, model, settings, on_device: bool):
        module, name = self.builder.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)(model, settings, on_device)


OPTIMIZER_KINDS = {
    "adamw": OptimizerKind("rul.training.optim.adamw", elementwise=True, on_device=True,
                           capturable=True),
    "muon": OptimizerKind("rul.training.muon.muon_adamw", elementwise=False, on_device=True,
                          capturable=True),
}

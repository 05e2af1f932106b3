"""The wrapper every kind's backbone is built into (rul.models.spec.build_network): RUL in
cycles."""

import torch
from torch import nn


class RULNet(nn.Module):
    """A backbone predicting RUL / rul_cap, scaled back to cycles (keeps targets O(1)).

    In eval mode predictions are clamped to the target's range [0, rul_cap]: no capped RUL lies
    outside it, so the clamp never moves a prediction away from any possible truth. Training
    sees the raw output, so gradients do not vanish outside the range.
    """

    def __init__(self, backbone: nn.Module, rul_cap: float):
        super().__init__()
        self.backbone = backbone
        self.register_buffer("rul_scale", torch.tensor(float(rul_cap)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rul = self.backbone(x) * self.rul_scale
        return rul if self.training else torch.clamp(rul, min=0.0, max=self.rul_scale)

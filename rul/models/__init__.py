"""Temporal models, chosen by `config.model`. Each maps (B, window, features) to RUL (B,)."""

import torch
from torch import nn

from rul.models.cnn import DCNN
from rul.models.recurrent import RecurrentRegressor
from rul.models.transformer import TransformerRegressor


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


def build_model(config, n_features: int) -> RULNet:
    c = config
    if c.model == "cnn":
        backbone = DCNN(n_features, c.window, c.filters, c.kernel_size, c.num_layers,
                        c.hidden_size, c.dropout)
    elif c.model in ("lstm", "gru"):
        backbone = RecurrentRegressor(n_features, c.model, c.hidden_size, c.num_layers, c.dropout)
    elif c.model == "transformer":
        backbone = TransformerRegressor(n_features, c.window, c.hidden_size, c.num_heads,
                                        c.num_layers, c.dropout)
    else:
        raise ValueError(f"unknown model {c.model!r}")
    return RULNet(backbone, c.rul_cap)


__all__ = ["DCNN", "RULNet", "RecurrentRegressor", "TransformerRegressor", "build_model"]

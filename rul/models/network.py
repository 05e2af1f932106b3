"""The network of each kind, wrapped to predict RUL in cycles."""

import torch
from torch import nn

from rul.models.spec import ARCHITECTURE_DEFAULTS, NETWORK_KINDS, NetworkSpec


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


def build_network(kind: str, n_features: int, window: int, rul_cap: float, **arch) -> RULNet:
    """The network of `kind` (its row of NETWORK_KINDS) from its architecture arguments
    (missing ones take defaults; unknown ones are ignored, so a stored spec outlives added or
    renamed config keys)."""
    if kind not in NETWORK_KINDS:
        raise ValueError(f"unknown model {kind!r}; expected one of {sorted(NETWORK_KINDS)}")
    row = NETWORK_KINDS[kind]
    shape = {"n_features": n_features, "window": window, "shape": (n_features, window)}
    architecture = {key: arch.get(key, ARCHITECTURE_DEFAULTS[key]) for key in row.args}
    backbone = row.backbone_class()(*(shape[name] for name in row.inputs), **row.fixed,
                                    **architecture)
    return RULNet(backbone, rul_cap)


def build_model(config, n_features: int) -> RULNet:
    """The network a training config describes."""
    return NetworkSpec.of(config, n_features).build()

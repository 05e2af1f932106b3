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


# Architecture arguments of each kind (what an inference spec stores). A spec that lacks one
# gets the training config's default (rul.config.Config), repeated here so that inference
# does not import the config (and YAML).
ARCHITECTURE_DEFAULTS = {"filters": 10, "kernel_size": 10, "num_layers": 4, "hidden_size": 100,
                         "dropout": 0.5, "num_heads": 4}
ARCHITECTURE_ARGS = {
    "cnn": ("filters", "kernel_size", "num_layers", "hidden_size", "dropout"),
    "lstm": ("hidden_size", "num_layers", "dropout"),
    "gru": ("hidden_size", "num_layers", "dropout"),
    "transformer": ("hidden_size", "num_heads", "num_layers", "dropout"),
}


def architecture_of(config) -> dict:
    """The architecture arguments of `config.model`, read from the config."""
    if config.model not in ARCHITECTURE_ARGS:
        raise ValueError(f"unknown model {config.model!r}")
    return {key: getattr(config, key) for key in ARCHITECTURE_ARGS[config.model]}


def build_network(kind: str, n_features: int, window: int, rul_cap: float, **arch) -> RULNet:
    """The network of `kind` from its architecture arguments (missing ones take defaults;
    unknown ones are ignored, so a stored spec outlives added or renamed config keys)."""
    if kind not in ARCHITECTURE_ARGS:
        raise ValueError(f"unknown model {kind!r}; expected one of {sorted(ARCHITECTURE_ARGS)}")
    a = {k: arch.get(k, ARCHITECTURE_DEFAULTS[k]) for k in ARCHITECTURE_ARGS[kind]}
    if kind == "cnn":
        backbone = DCNN(n_features, window, a["filters"], a["kernel_size"], a["num_layers"],
                        a["hidden_size"], a["dropout"])
    elif kind in ("lstm", "gru"):
        backbone = RecurrentRegressor(n_features, kind, a["hidden_size"], a["num_layers"],
                                      a["dropout"])
    else:
        backbone = TransformerRegressor(n_features, window, a["hidden_size"], a["num_heads"],
                                        a["num_layers"], a["dropout"])
    return RULNet(backbone, rul_cap)


def build_model(config, n_features: int) -> RULNet:
    """The network a training config describes."""
    return build_network(config.model, n_features, config.window, config.rul_cap,
                         **architecture_of(config))


__all__ = ["DCNN", "RULNet", "RecurrentRegressor", "TransformerRegressor",
           "architecture_of", "build_model", "build_network"]

"""What a network is, as plain values: its kind, input shape, output scale and architecture.

The single home of the network kinds (NETWORK_KINDS): the training config (rul.config), stored
inference specs and the benches all read them from here. Imports no torch until a network is
built, so that configuration and light tools stay light.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

# Every architecture key, one config key (rul.config.TrainConfig) per name shared by the kinds
# that take it, with what a stored spec without the key builds: the value networks had before
# the key was stored (the config's defaults are make train's recipe, which moves).
ARCHITECTURE_FALLBACKS = {"filters": 10, "kernel_size": 10, "num_layers": 4,
                          "hidden_size": 100, "dropout": 0.5, "num_heads": 4}


@dataclass(frozen=True)
class NetworkKind:
    """How one kind's backbone is built: backbone(*inputs, **fixed, **architecture).

    `backbone` names the class as "module.Class" (imported on first build); `inputs` are the
    data's shape it takes first ("n_features", "window", or "shape": the two as a pair);
    `args` its architecture keys in its constructor's order (what an inference spec stores;
    each a key of ARCHITECTURE_FALLBACKS);
    `fixed` constant keyword arguments that tell kinds of one class apart; `rule` what its
    architecture must satisfy (architecture -> (key, problem) or None), checked where a config
    or a tuning trial is made; `stacks` whether torch.func.vmap batches its layers, so that
    several members train at once (rul.training.stacked).
    """

    backbone: str
    inputs: tuple[str, ...]
    args: tuple[str, ...]
    fixed: dict = field(default_factory=dict)
    rule: Callable[[dict], tuple[str, str] | None] | None = None
    stacks: bool = False

    def backbone_class(self) -> type:
        module, name = self.backbone.rsplit(".", 1)
        return getattr(importlib.import_module(module), name)

    def problem(self, architecture: dict) -> tuple[str, str] | None:
        """What is wrong with `architecture` for this kind, as (key=value, problem); None: fine."""
        return self.rule(architecture) if self.rule else None


def _heads_divide_width(architecture: dict) -> tuple[str, str] | None:
    hidden, heads = architecture["hidden_size"], architecture["num_heads"]
    return (f"hidden_size={hidden}", f"must be divisible by num_heads={heads}") if hidden % heads \
        else None


NETWORK_KINDS = {
    "cnn": NetworkKind("rul.models.cnn.DCNN", ("shape",),
                       ("filters", "kernel_size", "num_layers", "hidden_size", "dropout"),
                       stacks=True),
    "lstm": NetworkKind("rul.models.recurrent.RecurrentRegressor", ("n_features",),
                        ("hidden_size", "num_layers", "dropout"), {"cell": "lstm"}),
    "gru": NetworkKind("rul.models.recurrent.RecurrentRegressor", ("n_features",),
                       ("hidden_size", "num_layers", "dropout"), {"cell": "gru"}),
    "transformer": NetworkKind("rul.models.transformer.TransformerRegressor",
                               ("n_features", "window"),
                               ("hidden_size", "num_heads", "num_layers", "dropout"),
                               rule=_heads_divide_width),
}
"""The network kinds, by the name `model:` takes.

To add a kind: write its backbone in a module of rul/models/ (an nn.Module mapping
(batch, window, features) to (batch,), without BatchNorm) and add its row here;
tests/test_model_kinds.py then checks it as it checks every kind. An architecture key that no
kind took before also needs its fallback in ARCHITECTURE_FALLBACKS and a TrainConfig field of
that name, listed in rul.config.LEGACY_VALUES (written only when it differs from the value
networks had before it) so that runs tracked before keep their identity."""
KINDS = tuple(NETWORK_KINDS)
# The architecture arguments each kind takes (what an inference spec stores).
ARCHITECTURE_ARGS = {kind: row.args for kind, row in NETWORK_KINDS.items()}


def unused_architecture_keys(kind: str) -> set[str]:
    """Architecture keys that `kind` does not take (not logged as its params)."""
    return set(ARCHITECTURE_FALLBACKS) - set(ARCHITECTURE_ARGS[kind])


@dataclass(frozen=True)
class NetworkSpec:
    """A network described by plain values; `build()` makes it (missing architecture
    arguments take their fallbacks, unknown ones are ignored). rul.plan.network_of makes a
    config's."""

    kind: str
    n_features: int
    window: int
    rul_cap: float
    architecture: dict

    def build(self):
        return build_network(self.kind, self.n_features, self.window, self.rul_cap,
                             **self.architecture)


def build_network(kind: str, n_features: int, window: int, rul_cap: float, **arch):
    """The network of `kind` (its row of NETWORK_KINDS) from its architecture arguments, in
    rul.models.network's RULNet (a missing argument takes its ARCHITECTURE_FALLBACKS value;
    unknown ones are ignored, so a stored spec outlives added or renamed config keys). Torch
    is imported here, on the first build."""
    from rul.models.network import RULNet

    if kind not in NETWORK_KINDS:
        raise ValueError(f"unknown model {kind!r}; expected one of {sorted(NETWORK_KINDS)}")
    row = NETWORK_KINDS[kind]
    shape = {"n_features": n_features, "window": window, "shape": (n_features, window)}
    architecture = {key: arch.get(key, ARCHITECTURE_FALLBACKS[key]) for key in row.args}
    backbone = row.backbone_class()(*(shape[name] for name in row.inputs), **row.fixed,
                                    **architecture)
    return RULNet(backbone, rul_cap)

"""What a network is, as plain values: its kind, input shape, output scale and architecture.

The single home of the network kinds (NETWORK_KINDS) and of the architecture defaults: the
training config (rul.config), stored inference specs and the benches all read them from here.
Imports no torch until a network is built, so that configuration and light tools stay light.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

# The default network of `make train` (Li et al.'s DCNN over a 30-cycle window).
DEFAULT_KIND = "cnn"
DEFAULT_WINDOW = 30
DEFAULT_RUL_CAP = 125
# Each architecture key's default: one config key (rul.config.TrainConfig) per name, shared by
# the kinds that take it, and what a stored spec without the key builds.
ARCHITECTURE_DEFAULTS = {"filters": 10, "kernel_size": 10, "num_layers": 4, "hidden_size": 100,
                         "dropout": 0.5, "num_heads": 4}


@dataclass(frozen=True)
class NetworkKind:
    """How one kind's backbone is built: backbone(*inputs, **fixed, **architecture).

    `backbone` names the class as "module.Class" (imported on first build); `inputs` are the
    data's shape it takes first ("n_features", "window", or "shape": the two as a pair);
    `args` its architecture keys in its constructor's order (what an inference spec stores;
    each a key of ARCHITECTURE_DEFAULTS);
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
kind took before also needs its default in ARCHITECTURE_DEFAULTS and a TrainConfig field of that
name, listed in rul.config.OMITTED_AT_DEFAULT (written only when it differs from its default) so
that runs tracked before keep their identity."""
KINDS = tuple(NETWORK_KINDS)
# The architecture arguments each kind takes (what an inference spec stores).
ARCHITECTURE_ARGS = {kind: row.args for kind, row in NETWORK_KINDS.items()}


def architecture_of(config) -> dict:
    """The architecture arguments of `config.model`, read from the config."""
    if config.model not in ARCHITECTURE_ARGS:
        raise ValueError(f"unknown model {config.model!r}")
    return {key: getattr(config, key) for key in ARCHITECTURE_ARGS[config.model]}


def unused_architecture_keys(kind: str) -> set[str]:
    """Architecture keys that `kind` does not take (not logged as its params)."""
    return set(ARCHITECTURE_DEFAULTS) - set(ARCHITECTURE_ARGS[kind])


@dataclass(frozen=True)
class NetworkSpec:
    """A network described by plain values; `build()` makes it (missing architecture
    arguments take their defaults, unknown ones are ignored)."""

    kind: str = DEFAULT_KIND
    n_features: int = 14
    window: int = DEFAULT_WINDOW
    rul_cap: float = DEFAULT_RUL_CAP
    architecture: dict = field(default_factory=lambda: dict(ARCHITECTURE_DEFAULTS))

    @classmethod
    def of(cls, config, n_features: int) -> "NetworkSpec":
        """The network a training config describes, for `n_features` inputs."""
        return cls(config.model, n_features, config.window, config.rul_cap,
                   architecture_of(config))

    def build(self):
        from rul.models.network import build_network

        return build_network(self.kind, self.n_features, self.window, self.rul_cap,
                             **self.architecture)

"""What a network is, as plain values: its kind, input shape, output scale and architecture.

The single home of the architecture defaults: the training config (rul.config), stored
inference specs and the benches all read them from here. Imports no torch until a network is
built, so that configuration and light tools stay light.
"""

from dataclasses import dataclass, field

# The default network of `make train` (Li et al.'s DCNN over a 30-cycle window).
DEFAULT_KIND = "cnn"
DEFAULT_WINDOW = 30
DEFAULT_RUL_CAP = 125
ARCHITECTURE_DEFAULTS = {"filters": 10, "kernel_size": 10, "num_layers": 4, "hidden_size": 100,
                         "dropout": 0.5, "num_heads": 4}
# The architecture arguments each kind takes (what an inference spec stores).
ARCHITECTURE_ARGS = {
    "cnn": ("filters", "kernel_size", "num_layers", "hidden_size", "dropout"),
    "lstm": ("hidden_size", "num_layers", "dropout"),
    "gru": ("hidden_size", "num_layers", "dropout"),
    "transformer": ("hidden_size", "num_heads", "num_layers", "dropout"),
}
KINDS = tuple(ARCHITECTURE_ARGS)


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

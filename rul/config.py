"""Run configuration: YAML file + `key=value` overrides, validated before any work starts."""

import contextlib
import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rul.data.schema import OPERATING_CONDITIONS, check_subset

CHOICES = {
    "normalization": ("minmax", "zscore"),
    "condition_scaling": ("auto", "global", "per_condition"),
    "model": ("cnn", "lstm", "gru", "transformer"),
    "scheduler": ("none", "cosine", "onecycle"),
    "precision": ("auto", "fp32", "fp16", "bf16"),
    "device": ("auto", "cpu", "cuda"),
    "pruner": ("median", "hyperband", "none"),
}


@dataclass
class Config:
    # data and preprocessing
    subset: str = "FD001"
    data_dir: str | None = None
    window: int = 30
    rul_cap: int = 125
    features: str | list = "informative"
    include_settings: bool = False
    drop_constant: bool = False
    normalization: str = "minmax"
    condition_scaling: str = "auto"  # per_condition for FD002/FD004 when auto
    smoothing_alpha: float = 0.1  # causal exponential smoothing per unit; 1 = off
    val_fraction: float = 0.2
    # model
    model: str = "cnn"
    hidden_size: int = 100
    num_layers: int = 4
    dropout: float = 0.5
    kernel_size: int = 10
    filters: int = 10  # cnn
    num_heads: int = 4  # transformer
    # optimization
    micro_batch_size: int = 256
    accumulation_steps: int = 2
    epochs: int = 100
    lr: float = 1e-3
    weight_decay: float = 0.0
    scheduler: str = "none"
    max_grad_norm: float | None = 1.0
    ema_decay: float = 0.99  # evaluate an exponential moving average of the weights; 0 = off
    precision: str = "auto"
    seed: int = 42
    deterministic: bool = False
    patience: int = 20
    device: str = "auto"
    # tracking and outputs
    tracking_uri: str | None = None
    experiment: str | None = None  # default rul-<subset>
    register: bool = True
    run_name: str | None = None
    checkpoint_dir: str = "mlruns/checkpoints"
    # tuning (used by `rul tune` only)
    search_space: dict = field(default_factory=dict)  # key -> {type, choices | low/high/log}
    max_effective_batch: int | None = None  # larger micro x K is pruned, not run
    scale_lr_with_batch: bool = False  # lr x effective_batch / 512 (linear scaling rule)
    n_trials: int = 12
    pruner: str = "median"  # median | hyperband | none
    pruner_warmup_epochs: int = 3
    study_name: str | None = None  # default rul-<subset>-tune

    @property
    def effective_batch_size(self) -> int:
        return self.micro_batch_size * self.accumulation_steps  # x world size (1 here)

    @property
    def n_conditions(self) -> int:
        if self.condition_scaling == "per_condition":
            return 6
        if self.condition_scaling == "global":
            return 1
        return OPERATING_CONDITIONS[self.subset]

    @property
    def experiment_name(self) -> str:
        return self.experiment or f"rul-{self.subset.lower()}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> "Config":
        return build(self.to_dict(), changes)


class ConfigError(ValueError):
    """A configuration key or value is invalid."""


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
# Keys read by `rul tune` only: not logged as a training run's params, not part of its identity.
TUNING_KEYS = ("search_space", "max_effective_batch", "scale_lr_with_batch", "n_trials",
               "pruner", "pruner_warmup_epochs", "study_name")
POSITIVE_INT = {"window", "rul_cap", "micro_batch_size", "accumulation_steps", "epochs",
                "hidden_size", "num_layers", "kernel_size", "filters", "num_heads", "patience",
                "n_trials"}
NON_NEGATIVE_INT = {"pruner_warmup_epochs"}
FLOATS = {"lr", "weight_decay", "val_fraction", "dropout", "max_grad_norm", "ema_decay",
          "smoothing_alpha"}
BOOLS = {"include_settings", "drop_constant", "deterministic", "register", "scale_lr_with_batch"}


def load(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Read a YAML config (or none: defaults) and apply overrides ('key=value' strings)."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of keys to values")
    if isinstance(overrides, dict):
        changes = overrides
    else:
        changes = dict(_parse_override(item) for item in overrides or [])
    return build(values, changes, source=str(path) if path else "config")


def build(values: dict, changes: dict | None = None, source: str = "config") -> Config:
    merged = {**values, **(changes or {})}
    unknown = [k for k in merged if k not in FIELDS]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"{source}: unknown key(s) {', '.join(hints)}")
    for key in FLOATS:  # YAML 1.1 reads 3e-4 (no dot) as a string
        if isinstance(merged.get(key), str):
            with contextlib.suppress(ValueError):
                merged[key] = float(merged[key])
    config = Config(**merged)
    _validate(config, source)
    return config


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like key=value")
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError:
        return key.strip(), raw


def _validate(config: Config, source: str) -> None:
    def fail(key, message):
        raise ConfigError(f"{source}: {key}={getattr(config, key)!r}: {message}")

    try:
        config.subset = check_subset(config.subset)
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None
    for key in POSITIVE_INT:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail(key, "must be a positive integer")
    for key in BOOLS:
        if not isinstance(getattr(config, key), bool):
            fail(key, "must be true or false")
    for key, allowed in CHOICES.items():
        if getattr(config, key) not in allowed:
            fail(key, f"must be one of {', '.join(allowed)}")
    for key in ("lr", "weight_decay", "val_fraction", "dropout", "ema_decay", "smoothing_alpha"):
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            fail(key, "must be a non-negative number")
    if config.lr <= 0:
        fail("lr", "must be > 0")
    if not 0 < config.val_fraction < 1:
        fail("val_fraction", "must be between 0 and 1 (validation units for early stopping)")
    if config.dropout >= 1:
        fail("dropout", "must be < 1")
    if config.ema_decay >= 1:
        fail("ema_decay", "must be a number in [0, 1) (0 turns the weight average off)")
    if not 0 < config.smoothing_alpha <= 1:
        fail("smoothing_alpha", "must be a number in (0, 1] (weight of the newest cycle; 1 = off)")
    if config.max_grad_norm is not None and (
        not isinstance(config.max_grad_norm, int | float) or config.max_grad_norm <= 0
    ):
        fail("max_grad_norm", "must be a positive number, or null to disable clipping")
    if not isinstance(config.seed, int) or isinstance(config.seed, bool) or config.seed < 0:
        fail("seed", "must be a non-negative integer")
    if config.model == "transformer" and config.hidden_size % config.num_heads:
        fail("hidden_size", f"must be divisible by num_heads={config.num_heads}")
    if config.max_effective_batch is not None and (
        not isinstance(config.max_effective_batch, int) or config.max_effective_batch < 1
    ):
        fail("max_effective_batch", "must be a positive integer or null")
    if not isinstance(config.search_space, dict):
        fail("search_space", "must be a mapping of config keys to distributions")
    for key, spec in config.search_space.items():
        if key not in FIELDS or key in ("search_space", "subset", "data_dir"):
            raise ConfigError(f"{source}: search_space: {key!r} is not a tunable config key")
        if not isinstance(spec, dict) or spec.get("type") not in ("categorical", "int", "float"):
            raise ConfigError(
                f"{source}: search_space.{key}: needs type categorical (choices) or int/float "
                "(low, high, optional log)"
            )
        if spec["type"] == "categorical" and not spec.get("choices"):
            raise ConfigError(f"{source}: search_space.{key}: categorical needs choices")
        if spec["type"] != "categorical" and not ("low" in spec and "high" in spec):
            raise ConfigError(f"{source}: search_space.{key}: needs low and high")
    from rul.preprocessing.features import candidate_columns

    try:
        candidate_columns(config.features, config.include_settings)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{source}: features: {error}") from None

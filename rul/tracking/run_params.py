"""A run's config as MLflow params, and back: the TrainConfig a run trained, read from them."""

import yaml

from rul.config import TrainConfig, build
from rul.config.training import with_legacy_values
from rul.models.spec import unused_architecture_keys
from rul.urls import masked

MAX_PARAM = 6000  # MLflow's limit on a param's length


def config_params(config, **extra) -> dict[str, str]:
    """A config as run params: its written keys, less empty values and the architecture keys
    its model does not take; `extra` adds or overrides (e.g. the global effective batch). A
    URL's secrets are masked: everyone who can read the store reads params."""
    unused = unused_architecture_keys(config.model)
    values = {k: v for k, v in config.to_dict().items() if v is not None and k not in unused}
    flat = {}
    for key, value in {**values, **extra}.items():  # a section (data:) one param per key
        parts = value.items() if isinstance(value, dict) else [(None, value)]
        flat.update({f"{key}.{sub}" if sub else key: v for sub, v in parts if v is not None})
    return {k: masked(str(v))[:MAX_PARAM] for k, v in flat.items()}


def config_from_params(params: dict[str, str]):
    """The TrainConfig a run trained, rebuilt from its params (strings as MLflow keeps them);
    the params a run logs beside its config (its world, an evaluation's seeds, the probe's
    figures) are left out."""
    values = {}
    for key, value in params.items():  # a section (data:) was logged one param per key
        section, _, sub = key.partition(".")
        if section in TrainConfig.model_fields:
            into = values.setdefault(section, {}) if sub else values
            into[sub or key] = yaml.safe_load(value)
    return build(with_legacy_values(values), source="params")

"""Run configuration: typed pydantic models for `rul train` (TrainConfig) and `rul tune`
(TuningConfig), read from YAML plus `key=value` overrides and validated before any work starts.

Defaults live only in the models; the YAML files in experiments/ override them. Every problem
becomes one line of a ConfigError: `<source>: <key>=<value>: <what is wrong>`.

- values: the value types of the keys and the strict base model
- spelling: did-you-mean hints for a misspelt key
- training: TrainConfig and what each key decides (KEY_ROLES, a run's identity)
- tuning: TuningConfig, its search-space dimensions and objectives
- loading: YAML and overrides in, a validated config or one-line errors out
"""

from rul.config.loading import build, build_tuning, load, load_tuning
from rul.config.training import (
    KEY_ROLES,
    LEGACY_VALUES,
    NOT_COMPARED_IN_A_STUDY,
    NOT_IN_IDENTITY,
    NOT_TUNABLE,
    TrainConfig,
)
from rul.config.tuning import (
    ACCURACY,
    DEFAULT_OBJECTIVES,
    OBJECTIVES,
    TUNING_KEYS,
    Categorical,
    Dimension,
    FloatRange,
    IntRange,
    TuningConfig,
)
from rul.errors import ConfigError

__all__ = ["ACCURACY", "DEFAULT_OBJECTIVES", "KEY_ROLES", "NOT_COMPARED_IN_A_STUDY",
           "NOT_IN_IDENTITY", "NOT_TUNABLE", "OBJECTIVES", "LEGACY_VALUES", "TUNING_KEYS",
           "Categorical", "ConfigError", "Dimension", "FloatRange", "IntRange", "TrainConfig",
           "TuningConfig", "build", "build_tuning", "load", "load_tuning"]

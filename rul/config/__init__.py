"""Run configuration: typed pydantic models for `rul train` (TrainConfig) and `rul tune`
(TuningConfig), read from YAML plus `key=value` overrides and validated before any work starts.

Defaults live only in the models; the YAML files in experiments/ override them. Every problem
becomes one line of a ConfigError: `<source>: <key>=<value>: <what is wrong>`.

- values: the value types of the keys and the strict base model
- spelling: did-you-mean hints for a misspelt key
- data: the `data:` section and the C-MAPSS presets
- study: the study's own keys (`rul tune`'s): search-space dimensions, objectives
- validation: a validated config, or one line per problem
- training: TrainConfig (its defaults: make train's recipe) and what each key decides
- tuning: TuningConfig, the base training config with the study's keys
- loading: YAML and overrides in, a validated config out
"""

from rul.config.loading import build, build_tuning, load, load_tuning
from rul.config.study import (
    ACCURACY,
    DEFAULT_OBJECTIVES,
    OBJECTIVES,
    TUNING_KEYS,
    Categorical,
    Dimension,
    FloatRange,
    IntRange,
)
from rul.config.training import (
    KEY_ROLES,
    LEGACY_VALUES,
    NOT_COMPARED_IN_A_STUDY,
    NOT_IN_IDENTITY,
    NOT_TUNABLE,
    TrainConfig,
)
from rul.config.tuning import TuningConfig
from rul.errors import ConfigError

__all__ = ["ACCURACY", "DEFAULT_OBJECTIVES", "KEY_ROLES", "NOT_COMPARED_IN_A_STUDY",
           "NOT_IN_IDENTITY", "NOT_TUNABLE", "OBJECTIVES", "LEGACY_VALUES", "TUNING_KEYS",
           "Categorical", "ConfigError", "Dimension", "FloatRange", "IntRange", "TrainConfig",
           "TuningConfig", "build", "build_tuning", "load", "load_tuning"]

"""Which columns feed the model."""

import numpy as np
import pandas as pd

from rul.data.schema import INFORMATIVE_SENSORS, SENSOR_COLUMNS, SETTING_COLUMNS

FEATURE_SETS = {"informative": INFORMATIVE_SENSORS, "all": SENSOR_COLUMNS}
AGE = "cycle"  # include_cycle's column: the engine's age, cycles since its record began
# Which track a model is on: the sensors alone (comparable with the published FD001 figures)
# or the sensors and the engine's age (include_cycle).
SENSORS, SENSORS_AND_AGE = "sensors", "sensors+age"


def track(include_cycle: bool) -> str:
    """The track of a model trained with or without the engine's age."""
    return SENSORS_AND_AGE if include_cycle else SENSORS


def candidate_columns(features: str | list[str], include_settings: bool,
                      include_cycle: bool = False, settings=SETTING_COLUMNS,
                      sensors=SENSOR_COLUMNS, informative=INFORMATIVE_SENSORS) -> list[str]:
    """Resolve a feature spec ('informative', 'all' or a list of sensor names) against a data
    set's `settings` and `sensors` (C-MAPSS's by default) and its `informative` sensors.

    `include_settings` puts the settings first; `include_cycle` adds the engine's age (the
    `cycle` column, time since the start of its record) last.
    """
    if isinstance(features, str):
        named = {"informative": informative, "all": sensors}
        if features not in named:
            raise ValueError(
                f"features must be one of {sorted(FEATURE_SETS)} or a list of columns, "
                f"got {features!r}"
            )
        columns = list(named[features])
    else:
        columns = list(features)
        unknown = [c for c in columns if c not in [*sensors, *settings]]
        if unknown or not columns:
            first, last = sensors[0], sensors[-1]
            raise ValueError(f"unknown feature columns {unknown}; the sensors are "
                             f"{first}..{last}" if len(sensors) > 2 else
                             f"unknown feature columns {unknown}; the sensors are "
                             f"{', '.join(sensors)}")
    if include_settings:
        columns = [c for c in settings if c not in columns] + columns
    if include_cycle:
        columns = columns + [AGE]
    return columns


def near_constant(frame: pd.DataFrame, columns: list[str], groups: np.ndarray,
                  tolerance: float) -> list[str]:
    """Columns whose standard deviation (raw units) is below `tolerance` in every group.

    Judged within operating conditions, since in FD002/FD004 the conditions alone move every
    sensor. FD001's s_1, s_5, s_6, s_10, s_16, s_18, s_19 fall below the default 0.01.
    """
    values = frame[columns].to_numpy()
    worst = np.zeros(len(columns))
    for group in np.unique(groups):
        worst = np.maximum(worst, values[groups == group].std(axis=0))
    return [c for c, spread in zip(columns, worst) if spread < tolerance]

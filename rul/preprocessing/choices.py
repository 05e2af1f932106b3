"""What a training decides from its data before the preprocessing is fitted, on the training
units only: how many operating conditions the settings hold and which sensors `features:
informative` reads. A C-MAPSS subset's are its preset's (readme.txt's count, the literature's
14 sensors); a data set of one's own gives them (`data.conditions`, `data.informative`) or
lets the stated rules decide (rul.preprocessing.conditions, rul.preprocessing.selection).
Each choice comes with its reason, which the run records and the command prints.
"""

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rul.data import Dataset
from rul.errors import ConfigError
from rul.preprocessing.conditions import count_conditions
from rul.preprocessing.scaling import ConditionScaler
from rul.preprocessing.selection import TREND, informative_sensors
from rul.preprocessing.settings import DataSettings


@dataclass(frozen=True)
class DataChoices:
    n_conditions: int
    conditions_reason: str
    informative: list  # the sensors `features: informative` reads, in the data set's order
    informative_reason: str


def choose(asked: DataSettings, dataset: Dataset, rows: pd.DataFrame) -> DataChoices:
    """The choices `asked` makes on `dataset`'s training `rows`."""
    section, layout = asked.dataset, dataset.layout
    settings = rows[list(layout.settings)].to_numpy(np.float64)
    n = asked.n_conditions
    if n is None:
        n, conditions_reason = count_conditions(settings, asked.seed)
    elif not asked.own:
        conditions_reason = f"{dataset.name}: {n} condition{'s' if n > 1 else ''} (preset)"
    else:
        conditions_reason = "as the config says"
    if section.informative != "auto":
        unknown = [s for s in section.informative if s not in layout.sensors]
        if unknown:
            raise ConfigError(f"data.informative: {unknown[0]!r} is not one of the data set's "
                              f"sensors ({', '.join(layout.sensors)})")
        return DataChoices(n, conditions_reason, list(section.informative),
                           f"{dataset.name}: as the data description lists them"
                           if asked.own else f"{dataset.name}: the preset's")
    if asked.features != "informative":
        return DataChoices(n, conditions_reason, [], "not chosen (features are given)")
    labels = (ConditionScaler(n_conditions=n).fit(settings, settings).conditions(settings)
              if n > 1 else np.zeros(len(rows), np.int64))  # as the preprocessing's scaler
    chosen, strength = informative_sensors(rows, list(layout.sensors), labels)
    if not chosen:
        strongest = strength.dropna().sort_values(ascending=False)
        best = (f"; the strongest: {strongest.index[0]} {strongest.iloc[0]:.2f}"
                if len(strongest) else "; every sensor is constant")
        raise ConfigError(f"features=informative: no sensor of {dataset.name} trends with the "
                          f"engines' age on the training units (mean |Spearman rho| >= {TREND:g}"
                          f"{best}); list them in data.informative, or features: all")
    return DataChoices(n, conditions_reason, chosen,
                       f"{len(chosen)} of {len(layout.sensors)} sensors trend with the engines' "
                       f"age (mean |Spearman rho| >= {TREND:g})")

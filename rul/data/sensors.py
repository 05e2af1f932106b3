"""Which of the sensors a `data:` section describes a data set keeps: one that holds one value
in every row of the training table tells nothing of wear. Named, it is refused (every such
sensor in one DataError); caught by a pattern, it is left out of the Layout, named in one
warning.
"""

import warnings
from dataclasses import replace
from pathlib import Path

import pandas as pd

from rul.data.errors import DataError
from rul.data.layout import Layout


class ConstantSensorsWarning(UserWarning):
    """A pattern of data.sensors matched sensors that hold one value in every row: dropped."""


def varying_sensors(section, layout: Layout, train: pd.DataFrame, path: Path
                    ) -> tuple[Layout, pd.DataFrame]:
    """(`layout` and the training rows `train` less the sensors a pattern caught that hold
    one value in every row); DataError naming every sensor the section names by name that
    does, or when no sensor is left."""
    values = train[list(layout.sensors)]
    constant = [s for s in layout.sensors if values[s].min() == values[s].max()]
    named = [s for s in constant if s in section.sensors]
    if named:
        listed = ", ".join(f"{s} ({values[s].iloc[0]:g})" for s in named)
        raise DataError(path, f"data.sensors: {listed} "
                              f"{'holds' if len(named) == 1 else 'hold'} one value in every row: "
                              f"{'it tells' if len(named) == 1 else 'they tell'} nothing of "
                              f"wear; leave {'it' if len(named) == 1 else 'them'} out")
    if not constant:
        return layout, train
    kept = tuple(s for s in layout.sensors if s not in constant)
    if not kept:
        raise DataError(path, f"data.sensors: every sensor matched ({', '.join(constant)}) "
                              "holds one value in every row: nothing tells of wear")
    warnings.warn(ConstantSensorsWarning(
        f"{path.name}: data.sensors: the patterns leave out {', '.join(constant)}: one value "
        "in every row"), stacklevel=3)
    return replace(layout, sensors=kept), train.drop(columns=constant)

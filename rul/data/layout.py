"""What each column of a data set is: the unit and time columns under the data set's own
names, its setting and sensor columns (resolved names, in order).

Inside rul a table's rows always carry `unit` and `cycle` (ID_COLUMNS: the engine and its
time) and the settings and sensors under their own names; `Layout.internal` renames a
table's unit and time columns to those, `Layout.external` back. C-MAPSS is CMAPSS: unit,
cycle, setting_1..3, s_1..s_21. Numpy and pandas only: the lean runtime imports it.
"""

from dataclasses import dataclass, field

import pandas as pd

from rul.data.schema import COLUMNS, SENSOR_COLUMNS, SETTING_COLUMNS

ID_COLUMNS = tuple(COLUMNS[:2])  # unit, cycle: what rul calls the engine and its time


@dataclass(frozen=True)
class Layout:
    unit: str = "unit"  # the data set's name of the engine column
    time: str = "cycle"  # its name of the time column
    settings: tuple = field(default=tuple(SETTING_COLUMNS))
    sensors: tuple = field(default=tuple(SENSOR_COLUMNS))

    @property
    def columns(self) -> list[str]:
        """The columns of a table as rul holds it: unit, cycle, settings, sensors."""
        return [*ID_COLUMNS, *self.settings, *self.sensors]

    @property
    def names(self) -> list[str]:
        """The columns under the data set's own names."""
        return [self.unit, self.time, *self.settings, *self.sensors]

    def own(self, column: str) -> str:
        """A column's name in the data set (`unit` -> the data set's unit column)."""
        return {ID_COLUMNS[0]: self.unit, ID_COLUMNS[1]: self.time}.get(column, column)

    def internal(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with the unit and time columns renamed as rul holds them."""
        renamed = {self.unit: ID_COLUMNS[0], self.time: ID_COLUMNS[1]}
        return frame if self.is_cmapss_ids else frame.rename(columns=renamed)

    def external(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with the unit and time columns under the data set's own names."""
        renamed = {ID_COLUMNS[0]: self.unit, ID_COLUMNS[1]: self.time}
        return frame if self.is_cmapss_ids else frame.rename(columns=renamed)

    @property
    def is_cmapss_ids(self) -> bool:
        return (self.unit, self.time) == ID_COLUMNS

    def to_dict(self) -> dict:
        return {"unit": self.unit, "time": self.time, "settings": list(self.settings),
                "sensors": list(self.sensors)}

    @classmethod
    def from_dict(cls, values: dict | None) -> "Layout":
        """A stored layout; none (a model logged before layouts): C-MAPSS's."""
        if not values:
            return CMAPSS
        return cls(str(values["unit"]), str(values["time"]),
                   tuple(str(c) for c in values["settings"]),
                   tuple(str(c) for c in values["sensors"]))


CMAPSS = Layout()

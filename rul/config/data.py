"""The `data:` section: a data set described by its columns (a fleet's own table, CSV or
Parquet, one file or train/test), and C-MAPSS FD001-FD004 as presets of the same description
(`subset: FD001` expands to `preset("FD001")`).

Names may be given as glob patterns (`s_*`, `T*`): they are matched against the table's
columns when it is read (rul.data.tables). The model reads its inputs in one canonical order,
whatever the table's: settings and sensors in the order the section names them, a pattern's
matches in the natural order of their names (T2, T24, T30; s_2 before s_10).
"""

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from rul.config.values import (
    NonNegativeInt,
    OptionalText,
    PositiveInt,
    Text,
    _number,
    _one_of,
    _Strict,
    rule_error,
)
from rul.data.schema import (
    INFORMATIVE_SENSORS,
    OPERATING_CONDITIONS,
    SENSOR_COLUMNS,
    SETTING_COLUMNS,
    SUBSETS,
    file_names,
)

Names = Annotated[list[str], Field(description="a list of column names or patterns")]


def _as_list(value: Any) -> Any:
    """One name or pattern given as a string is a list of one (`auto` stays a choice)."""
    return [value] if isinstance(value, str) and value != "auto" else value


class DataSection(_Strict):
    """A data set: where its rows are and what each column is."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                               description="a name of letters, digits, '.', '_' or '-'")]
    """The data set's name: the experiment is rul-<name> and the registered model too."""
    train: Text
    """The table of run-to-failure histories (CSV, Parquet, or C-MAPSS text); relative to
    data_dir when it is set, else to the working folder."""
    test: OptionalText = None
    """A table of histories cut off before failure, scored against test_rul; null: a share
    of the units (test_fraction) is held out and cut off as C-MAPSS's test units are."""
    test_rul: OptionalText = None
    """The true RUL at the last row of each test unit: a file of one number per line, in the
    order the test table's units first appear; or give test_rul_column."""
    test_rul_column: OptionalText = None
    """A column of the test table holding each unit's true RUL at its last row."""
    format: _one_of("auto", "csv", "parquet", "cmapss") = "auto"
    """The files' format; auto: by suffix (.csv, .parquet/.pq, .txt: C-MAPSS text)."""
    delimiter: Annotated[Literal["auto", ",", ";", "|", "tab"], Field(
        description="auto, ',', ';', '|' or tab")] = "auto"
    """A CSV file's delimiter; auto: the one of , ; tab | that splits the file's first lines
    into the same number of fields, two or more (a comma when none does)."""
    unit: Text = "unit"
    """The column naming each engine (a positive whole number)."""
    time: Text = "cycle"
    """The column counting each engine's cycles (whole numbers, increasing)."""
    settings: Names = []
    """Operating-setting columns (zero or more): they decide the operating condition."""
    sensors: Names
    """Sensor columns (one or more): what the model may read."""
    informative: Annotated[Literal["auto"] | list[str], Field(
        description="auto or a list of sensor names")] = "auto"
    """The sensors `features: informative` reads; auto: chosen on the training units (those
    that vary and trend with wear: rul.preprocessing.selection)."""
    conditions: Annotated[Literal["auto"] | PositiveInt, Field(
        description="auto or a positive integer")] = "auto"
    """The number of operating conditions; auto: found from the settings on the training
    units (rul.preprocessing.conditions)."""
    censored_column: OptionalText = None
    """A column, true on the rows of engines that have not failed yet (right-censored): an
    engine with a true row is in service. Give at most one of censored_column, failed_column
    and censored_units."""
    failed_column: OptionalText = None
    """A column, true on the rows of engines that failed (censored_column's opposite): an
    engine with no true row is in service."""
    censored_units: Annotated[list[int] | None, Field(
        description="a list of unit numbers, or null")] = None
    """The engines that have not failed yet, by unit number."""
    test_fraction: _number("a number strictly between 0 and 1", gt=0, lt=1) = 0.2
    """Without a test table: the share of units held out and cut off as a test set."""
    test_seed: NonNegativeInt = 0
    """Without a test table: the seed of the units held out and of where they are cut off
    (the same test units whatever the run's seed)."""

    _lists = field_validator("settings", "sensors", "informative", mode="before")(_as_list)

    @model_validator(mode="after")
    def _rul_of_the_test(self) -> "DataSection":
        if self.test is None and (self.test_rul or self.test_rul_column):
            raise rule_error("data.test_rul", "needs data.test (the table it scores)")
        if self.test is not None and not (self.test_rul or self.test_rul_column):
            raise rule_error("data.test", "needs data.test_rul (a file) or "
                                          "data.test_rul_column (a column of the test table)")
        if self.test_rul and self.test_rul_column:
            raise rule_error("data.test_rul", "give data.test_rul or data.test_rul_column, "
                                              "not both")
        if not self.sensors:
            raise rule_error("data.sensors", "needs at least one column")
        given = [key for key in ("censored_column", "failed_column", "censored_units")
                 if getattr(self, key)]
        if len(given) > 1:
            raise rule_error(f"data.{given[0]}", "the engines in service are given once: "
                                                 f"data.{given[0]} or data.{given[1]}, not both")
        return self

    @property
    def preset(self) -> bool:
        """A C-MAPSS subset's description: its files come from data_dir, CMAPSS_DIR, the
        cache or a verified download (rul.data.sources)."""
        return self.format == "cmapss" and self.name in SUBSETS and \
            self.train == file_names(self.name)["train"]


def preset(subset: str) -> DataSection:
    """What `subset: FD00x` means: NASA's three files and 26 columns, its conditions' count
    (readme.txt) and the 14 sensors the literature reads since Li et al. 2018."""
    files = file_names(subset)
    return DataSection(name=subset, train=files["train"], test=files["test"],
                       test_rul=files["rul"], format="cmapss", settings=list(SETTING_COLUMNS),
                       sensors=list(SENSOR_COLUMNS), informative=list(INFORMATIVE_SENSORS),
                       conditions=OPERATING_CONDITIONS[subset])

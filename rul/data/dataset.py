"""A data set, loaded and validated: a C-MAPSS subset (`load_subset`) or a fleet's own tables
as a `data:` section describes them (`load_dataset`): its training histories, its test
histories with their true RUL (the test table's, or a share of the engines held out and cut
off: rul.data.holdout), which engines have not failed yet, and its Layout.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rul.data.errors import DataError
from rul.data.holdout import hold_out
from rul.data.layout import CMAPSS, Layout
from rul.data.reader import read_rul, read_trajectories
from rul.data.schema import check_subset, file_names
from rul.data.sources import locate, sha256_of
from rul.files import DATA_LIMIT, SizeLimit


@dataclass
class Dataset:
    name: str
    train: pd.DataFrame  # run-to-failure histories (the censored engines' up to now)
    test: pd.DataFrame  # histories cut off before failure
    test_rul: np.ndarray  # true RUL at each test unit's last row, units in order of appearance
    files: dict[str, Path]  # role -> path
    layout: Layout = CMAPSS
    censored: tuple = ()  # training units that have not failed yet (right-censored)
    held_out: tuple = ()  # the test units, when they were held out of the training table

    def file_digests(self) -> dict[str, str]:
        """SHA-256 of each file, by role (recorded with every tracked run)."""
        return {role: sha256_of(path) for role, path in self.files.items()}


CMAPSSSubset = Dataset  # its name when only C-MAPSS could be read


def load_subset(subset: str, data_dir: str | Path | None = None, *, download: bool = True,
                limit: SizeLimit = DATA_LIMIT) -> Dataset:
    """Locate (see rul.data.sources), parse and validate one C-MAPSS subset; a file over
    `limit` is refused before it is read."""
    subset = check_subset(subset)
    directory = locate(subset, data_dir, download=download)
    files = {role: directory / name for role, name in file_names(subset).items()}
    train = read_trajectories(files["train"], limit)
    test = read_trajectories(files["test"], limit)
    test_units = test["unit"].unique()
    test_rul = read_rul(files["rul"], len(test_units), limit)
    if not np.array_equal(np.sort(test_units), test_units):
        raise DataError(files["test"], "units are not in increasing order")
    return Dataset(subset, train, test, test_rul, files)


def load_dataset(section, data_dir: str | Path | None = None, *, download: bool = True,
                 limit: SizeLimit = DATA_LIMIT) -> Dataset:
    """The data set a `data:` section describes (rul.config.data): a C-MAPSS preset from
    where C-MAPSS is found, else the section's own tables, relative to `data_dir` (or the
    working folder)."""
    if section.preset:
        return load_subset(section.name, data_dir, download=download, limit=limit)
    from rul.data.censoring import censored_units
    from rul.data.sensors import varying_sensors
    from rul.data.tables import read_rows

    folder = Path(data_dir) if data_dir else Path()
    train_path = folder / section.train
    keep = {key: getattr(section, key) for key in ("censored_column", "failed_column")
            if getattr(section, key)}
    train, layout, kept = read_rows(train_path, section, limit=limit, keep=keep)
    check_histories(train, section, train_path)
    files = {"train": train_path}
    censored = censored_units(section, train, kept, train_path)
    layout, train = varying_sensors(section, layout, train, train_path)
    if section.test is None:
        try:
            train, test, test_rul = hold_out(train, section.test_fraction, section.test_seed,
                                             keep=censored)
        except ValueError as error:
            raise DataError(train_path, str(error)) from None
        held = tuple(int(u) for u in pd.unique(test["unit"]))
        return Dataset(section.name, train, test, test_rul, files, layout, censored, held)
    test_path = folder / section.test
    keep = {"test_rul_column": section.test_rul_column} if section.test_rul_column else {}
    test, _, kept = read_rows(test_path, section, layout, limit=limit, keep=keep)
    files["test"] = test_path
    n_units = len(pd.unique(test["unit"]))
    if section.test_rul_column:
        test_rul = _rul_column(test, kept, section.test_rul_column, test_path)
    else:
        files["rul"] = folder / section.test_rul
        test_rul = read_rul(files["rul"], n_units, limit)
    return Dataset(section.name, train, test, test_rul, files, layout, censored)


def check_histories(train: pd.DataFrame, section, path: Path) -> None:
    """Training units are engines' histories, a row per cycle: when no unit has two rows,
    nothing ages and there is nothing to learn (DataError saying so, before any choice is
    made on the rows)."""
    units = train["unit"].to_numpy()
    if len(units) and not (units[1:] == units[:-1]).any():
        raise DataError(path, f"every unit has one row ({len(units):,} units): a unit is one "
                              f"engine's history, a row per cycle; is data.unit "
                              f"({section.unit}) the column naming the engine?")


def _rul_column(test: pd.DataFrame, kept: pd.DataFrame, column: str, path: Path
                ) -> np.ndarray:
    """Each test unit's true RUL: `column` at its last row (whole numbers >= 0)."""
    values = pd.to_numeric(kept[column], errors="coerce").to_numpy(np.float64)
    last = np.r_[test["unit"].to_numpy()[1:] != test["unit"].to_numpy()[:-1], True]
    rul = values[last]
    if not np.isfinite(rul).all() or (rul < 0).any() or (rul != np.round(rul)).any():
        raise DataError(path, f"data.test_rul_column: column {column!r} must hold a whole "
                              "number >= 0 at each unit's last row")
    return rul.astype(np.int64)

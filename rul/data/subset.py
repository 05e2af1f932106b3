"""One C-MAPSS subset, loaded and validated."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rul.data.errors import DataError
from rul.data.reader import read_rul, read_trajectories
from rul.data.schema import check_subset, file_names
from rul.data.sources import locate, sha256_of
from rul.files import DATA_LIMIT, SizeLimit


@dataclass
class CMAPSSSubset:
    name: str
    train: pd.DataFrame  # run-to-failure trajectories
    test: pd.DataFrame  # trajectories cut off before failure
    test_rul: np.ndarray  # true RUL at the last test cycle, one per test unit (unit order)
    files: dict[str, Path]  # role -> path

    def file_digests(self) -> dict[str, str]:
        """SHA-256 of each file, by role (recorded with every tracked run)."""
        return {role: sha256_of(path) for role, path in self.files.items()}


def load_subset(subset: str, data_dir: str | Path | None = None, *, download: bool = True,
                limit: SizeLimit = DATA_LIMIT):
    """Locate (see rul.data.sources), parse and validate one subset; a file over `limit`
    is refused before it is read."""
    subset = check_subset(subset)
    directory = locate(subset, data_dir, download=download)
    files = {role: directory / name for role, name in file_names(subset).items()}
    train = read_trajectories(files["train"], limit)
    test = read_trajectories(files["test"], limit)
    test_units = test["unit"].unique()
    test_rul = read_rul(files["rul"], len(test_units), limit)
    if not np.array_equal(np.sort(test_units), test_units):
        raise DataError(files["test"], "units are not in increasing order")
    return CMAPSSSubset(subset, train, test, test_rul, files)

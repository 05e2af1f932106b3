"""Which training engines have not failed yet (right-censored), as a `data:` section says it:
`censored_units` (their numbers), `censored_column` (true on the rows of an engine in
service: an engine with a true row is in service) or `failed_column` (true on the rows of an
engine that failed: an engine with no true row is in service). A marker read the wrong way
round makes most of a fleet censored: more than half, and one warning names the key, its
column and what it was taken to mean.
"""

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from rul.data.errors import DataError


class MostlyCensoredWarning(UserWarning):
    """More than half of the engines are taken to be in service."""


def censored_units(section, train: pd.DataFrame, kept: pd.DataFrame, path: Path) -> tuple:
    """The training units that have not failed, sorted; `kept`: the marker column, as read,
    row for row beside `train`."""
    units = pd.unique(train["unit"])
    if section.censored_units:
        unknown = sorted(set(section.censored_units) - set(int(u) for u in units))
        if unknown:
            raise DataError(path, f"data.censored_units: no unit {unknown[0]} in the table")
        censored = tuple(sorted(int(u) for u in section.censored_units))
        said = "as data.censored_units lists them"
    elif section.censored_column or section.failed_column:
        key = "censored_column" if section.censored_column else "failed_column"
        column = getattr(section, key)
        flags = kept[column]
        if flags.dtype.kind not in "biu" or not flags.isin([0, 1, True, False]).all():
            raise DataError(path, f"data.{key}: column {column!r} must hold true/false "
                                  "(or 1/0)")
        marked = pd.unique(train["unit"][flags.astype(bool).to_numpy()])
        chosen = marked if key == "censored_column" else np.setdiff1d(units, marked)
        censored = tuple(sorted(int(u) for u in chosen))
        other = "failed_column" if key == "censored_column" else "censored_column"
        said = (f"data.{key}: {column!r} taken as true on the engines "
                f"{'in service' if key == 'censored_column' else 'that failed'}; if it is "
                f"true on those {'that failed' if key == 'censored_column' else 'in service'},"
                f" give data.{other}: {column}")
    else:
        return ()
    if 2 * len(censored) > len(units):
        warnings.warn(MostlyCensoredWarning(
            f"{path.name}: {len(censored)} of {len(units)} engines in service, {said}"),
            stacklevel=3)
    return censored

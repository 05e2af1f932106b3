"""C-MAPSS data: file schema, validated readers, sources (local or verified download).

`load_subset` and `CMAPSSSubset` pull in the download code (urllib, tqdm); they are imported
on first use, so that inference (`rul.data.schema`, `rul.data.validation`) stays lean.
"""

from rul.data.errors import DataError, DataUnavailableError
from rul.data.schema import COLUMNS, INFORMATIVE_SENSORS, SUBSETS

__all__ = [
    "COLUMNS", "INFORMATIVE_SENSORS", "SUBSETS", "CMAPSSSubset", "DataError",
    "DataUnavailableError", "load_subset",
]

_LAZY = {"CMAPSSSubset", "load_subset"}


def __getattr__(name: str):
    if name in _LAZY:
        from rul.data import subset

        return getattr(subset, name)
    raise AttributeError(f"module 'rul.data' has no attribute {name!r}")

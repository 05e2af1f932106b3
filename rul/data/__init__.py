"""Data: C-MAPSS's file schema and a fleet's own tables (a Layout of named columns),
validated readers, sources (local or verified download), held-out test engines.

`load_subset`, `load_dataset` and `Dataset` pull in the download code (urllib, tqdm), as does
`cmapss_file` (where rul reads a C-MAPSS file: `cmapss_file("test_FD001.txt")`); they are
imported on first use, so that inference (`rul.data.schema`, `rul.data.validation`) stays
lean.
"""

from rul.data.errors import DataError, DataUnavailableError
from rul.data.schema import COLUMNS, INFORMATIVE_SENSORS, SUBSETS

__all__ = [
    "COLUMNS", "INFORMATIVE_SENSORS", "SUBSETS", "CMAPSSSubset", "DataError",
    "DataUnavailableError", "Dataset", "cmapss_file", "load_dataset", "load_subset",
]

_LAZY = {"CMAPSSSubset", "Dataset", "load_dataset", "load_subset"}


def __getattr__(name: str):
    if name == "cmapss_file":
        from rul.data import sources

        return sources.cmapss_file
    if name in _LAZY:
        from rul.data import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module 'rul.data' has no attribute {name!r}")

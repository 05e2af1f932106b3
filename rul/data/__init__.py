"""C-MAPSS data: file schema, validated readers, sources (local or verified download)."""

from rul.data.errors import DataError, DataUnavailableError
from rul.data.schema import COLUMNS, INFORMATIVE_SENSORS, SUBSETS
from rul.data.subset import CMAPSSSubset, load_subset

__all__ = [
    "COLUMNS", "INFORMATIVE_SENSORS", "SUBSETS", "CMAPSSSubset", "DataError",
    "DataUnavailableError", "load_subset",
]

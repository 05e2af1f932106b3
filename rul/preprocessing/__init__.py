"""Preprocessing: target, features, scaling, windows, and the Preprocessor that ties them.

The Preprocessor (a scikit-learn estimator) is imported on first use, so that the lean
runtime reads the fitted numbers (rul.preprocessing.fitted) without scikit-learn.
"""

from rul.preprocessing.target import piecewise_rul
from rul.preprocessing.windows import WindowSet

__all__ = ["Preprocessor", "WindowSet", "piecewise_rul"]


def __getattr__(name: str):
    if name == "Preprocessor":
        from rul.preprocessing.pipeline import Preprocessor

        return Preprocessor
    raise AttributeError(f"module 'rul.preprocessing' has no attribute {name!r}")

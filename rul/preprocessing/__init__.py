"""Preprocessing: target, features, scaling, windows, and the Preprocessor that ties them."""

from rul.preprocessing.pipeline import Preprocessor
from rul.preprocessing.target import piecewise_rul
from rul.preprocessing.windows import WindowSet

__all__ = ["Preprocessor", "WindowSet", "piecewise_rul"]

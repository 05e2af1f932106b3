"""Temporal models, one per kind (`model:`). Each maps (B, window, features) to RUL (B,).

The plain description of a network (NetworkSpec, the table of kinds NETWORK_KINDS) lives in
rul.models.spec and imports no torch; the networks themselves are imported on first use.
"""

from rul.models.spec import ARCHITECTURE_ARGS, NetworkSpec, build_network

__all__ = ["ARCHITECTURE_ARGS", "DCNN", "NetworkSpec", "RULNet", "RecurrentRegressor",
           "TransformerRegressor", "build_network"]

_LAZY = {"RULNet": "rul.models.network", "DCNN": "rul.models.cnn",
         "RecurrentRegressor": "rul.models.recurrent",
         "TransformerRegressor": "rul.models.transformer"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rul.models' has no attribute {name!r}")

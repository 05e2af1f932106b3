"""What a logged model needs to predict, and the prediction itself (no MLflow here).

The inference spec is a small JSON document stored with the model instead of the whole
training config: the model kind, its architecture arguments, window, rul_cap, n_features and
a format version, and the calibrated prediction interval (rul.evaluation.conformal.Interval)
when the model has one. Loading ignores keys it does not know and fills missing optional ones
with their defaults, so a model registered today still loads after config keys are added or
renamed; a spec without `interval` (older models, or interval_coverage: null) predicts no bounds.
"""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rul.data.errors import DataError
from rul.data.validation import validate_rows
from rul.evaluation.conformal import Interval
from rul.models import ARCHITECTURE_ARGS, build_network
from rul.preprocessing.windows import unit_lengths

FORMAT_VERSION = 1
SHORT_HISTORY = ("pad", "reject")


@dataclass(frozen=True)
class InferenceSpec:
    model: str  # cnn | lstm | gru | transformer
    window: int
    rul_cap: float
    n_features: int
    architecture: dict = field(default_factory=dict)  # build_network's keyword arguments
    format_version: int = FORMAT_VERSION
    interval: Interval | None = None  # None: the model predicts no bounds

    @classmethod
    def from_config(cls, config, n_features: int,
                    interval: Interval | None = None) -> "InferenceSpec":
        from rul.models import architecture_of

        return cls(config.model, config.window, config.rul_cap, n_features,
                   architecture_of(config), interval=interval)

    @classmethod
    def from_dict(cls, values: dict, defaults: dict | None = None) -> "InferenceSpec":
        """Read a stored spec: unknown keys are ignored, missing optional ones take
        `defaults` (e.g. the fitted preprocessor's window) or the class defaults."""
        values = {**(defaults or {}), **values}
        version = int(values.get("format_version", FORMAT_VERSION))
        if version > FORMAT_VERSION:
            raise ValueError(f"inference spec format_version {version} is newer than this "
                             f"rul understands ({FORMAT_VERSION}); upgrade rul")
        missing = [k for k in ("model", "window", "rul_cap", "n_features") if k not in values]
        if missing:
            raise ValueError(f"inference spec lacks {missing}")
        if values["model"] not in ARCHITECTURE_ARGS:
            raise ValueError(f"inference spec: unknown model {values['model']!r}")
        interval = values.get("interval")
        try:
            interval = None if interval is None else Interval.from_dict(interval)
        except (TypeError, ValueError) as error:
            raise ValueError(f"inference spec: {error}") from None
        return cls(str(values["model"]), int(values["window"]), float(values["rul_cap"]),
                   int(values["n_features"]), dict(values.get("architecture") or {}), version,
                   interval)

    @classmethod
    def read(cls, path: str | Path, defaults: dict | None = None) -> "InferenceSpec":
        return cls.from_dict(json.loads(Path(path).read_text()), defaults)

    def write(self, path: str | Path) -> None:
        """The JSON; without an interval, exactly the keys specs had before intervals."""
        values = asdict(self)
        if self.interval is None:
            del values["interval"]
        Path(path).write_text(json.dumps(values, indent=1))

    def build_network(self) -> torch.nn.Module:
        return build_network(self.model, self.n_features, self.window, self.rul_cap,
                             **self.architecture)


def predict_frame(preprocessor, model, rows: pd.DataFrame, source="input",
                  short_history: str = "pad", interval: Interval | None = None) -> pd.DataFrame:
    """RUL at the last cycle of each unit in `rows`: columns unit, rul, padded; with an
    `interval`, also rul_lower and rul_upper (between rul and padded), clipped to
    [0, rul_cap] like rul.

    `rows` are raw C-MAPSS rows (integer or float columns), checked by validate_rows: each
    unit's rows contiguous with strictly increasing cycles. Give each unit's whole history,
    not only its last window: sensors are smoothed causally from a unit's first row.
    A unit with fewer rows than the window is front-padded with its first row and flagged
    `padded` (short_history="pad", the default), or rejected (short_history="reject").
    Units come out in the order they come in.
    """
    if short_history not in SHORT_HISTORY:
        raise ValueError(f"short_history must be one of {SHORT_HISTORY}, got {short_history!r}")
    rows = validate_rows(rows, source)
    ids, lengths = unit_lengths(rows["unit"].to_numpy())
    padded = lengths < preprocessor.window
    if short_history == "reject" and padded.any():
        listed = ", ".join(f"unit {u} has {n} rows" for u, n in zip(ids[padded], lengths[padded]))
        raise DataError(source, f"history shorter than the window ({preprocessor.window} "
                                f"cycles): {listed}")
    units, windows = preprocessor.last_windows(rows)
    with torch.inference_mode():
        rul = model(torch.as_tensor(windows, dtype=torch.float32)).numpy()
    result = {"unit": units.astype(np.int64), "rul": rul.astype(np.float64)}
    if interval is not None:
        result["rul_lower"], result["rul_upper"] = interval.bounds(
            result["rul"], high=preprocessor.rul_cap)
    return pd.DataFrame({**result, "padded": padded})

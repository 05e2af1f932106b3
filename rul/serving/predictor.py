"""What a logged model needs to predict, and the prediction itself (no MLflow here).

The inference spec is a small JSON document stored with the model instead of the whole
training config: the model kind, its architecture arguments, window, rul_cap, n_features and
a format version, the calibrated prediction interval (rul.evaluation.conformal.Interval)
when the model has one, and `members` for an ensemble. Loading ignores keys it does not know and
fills missing optional ones with their defaults, so a model registered today still loads after
config keys are added or renamed; a spec without `interval` (older models, or
interval_coverage: null) predicts no bounds. A "banded" interval also gives `p_fail_within`,
the probability that the engine fails within `horizon` cycles (its true RUL <= horizon). The
spec's `track` says whether the model reads the engine's age ("sensors+age") or the sensors
alone ("sensors"); specs written before it existed take it from the preprocessor.

An ensemble model holds `members` networks of one architecture; its prediction is their mean
(`average_members`), and the members' spread comes out as the column `rul_std`.
"""

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from rul.data.errors import DataError
from rul.data.validation import validate_rows
from rul.evaluation.conformal import DEFAULT_HORIZON, Interval
from rul.models.spec import ARCHITECTURE_ARGS, NetworkSpec
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
    members: int = 1  # networks averaged (an ensemble); their weights are a list
    track: str | None = None  # "sensors" or "sensors+age" (rul.preprocessing.features.track)

    @classmethod
    def from_network(cls, network, interval: Interval | None = None,
                     members: int = 1, track: str | None = None) -> "InferenceSpec":
        """The spec of a trained rul.models.NetworkSpec (with its interval, members, track)."""
        return cls(network.kind, network.window, network.rul_cap, network.n_features,
                   dict(network.architecture), interval=interval, members=members,
                   track=track)

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
        members = int(values.get("members", 1))
        if members < 1:
            raise ValueError(f"inference spec: members must be >= 1, got {members}")
        track = values.get("track")
        return cls(str(values["model"]), int(values["window"]), float(values["rul_cap"]),
                   int(values["n_features"]), dict(values.get("architecture") or {}), version,
                   interval, members, None if track is None else str(track))

    @classmethod
    def read(cls, path: str | Path, defaults: dict | None = None) -> "InferenceSpec":
        return cls.from_dict(json.loads(Path(path).read_text()), defaults)

    def write(self, path: str | Path) -> None:
        """The JSON; a single model without an interval writes exactly the keys specs had
        before intervals and ensembles."""
        values = asdict(self)
        if self.interval is None:
            del values["interval"]
        else:
            values["interval"] = self.interval.to_dict()
        if self.members == 1:
            del values["members"]
        if self.track is None:
            del values["track"]
        Path(path).write_text(json.dumps(values, indent=1))

    def build_network(self) -> torch.nn.Module:
        return NetworkSpec(self.model, self.n_features, self.window, self.rul_cap,
                           self.architecture).build()


def member_predictions(networks: Sequence[torch.nn.Module], windows) -> np.ndarray:
    """RUL of each window by each network: shape (members, windows), float64."""
    x = torch.as_tensor(windows, dtype=torch.float32)
    with torch.inference_mode():
        return np.stack([net(x).numpy().astype(np.float64) for net in networks])


def average_members(predictions) -> tuple[np.ndarray, np.ndarray]:
    """An ensemble's prediction per window, the mean over members (axis 0), and the members'
    spread, their population standard deviation (0 for a single network)."""
    predictions = np.asarray(predictions, dtype=np.float64)
    return predictions.mean(axis=0), predictions.std(axis=0)


def predict_frame(preprocessor, model, rows: pd.DataFrame, source="input",
                  short_history: str = "pad", interval: Interval | None = None,
                  horizon: float = DEFAULT_HORIZON) -> pd.DataFrame:
    """RUL at the last cycle of each unit in `rows`: columns unit, rul, padded; with an
    `interval`, also rul_lower and rul_upper (between rul and padded), clipped to
    [0, rul_cap] like rul, and with a "banded" one p_fail_within after them: the probability
    that the true RUL is at most `horizon` cycles (0 < horizon < rul_cap).

    `model` is a network, or a list of networks (an ensemble): then `rul` is their mean and
    the column `rul_std` their spread per unit (see `average_members`).

    `rows` are raw C-MAPSS rows (integer or float columns), checked by validate_rows: each
    unit's rows contiguous with strictly increasing cycles. Give each unit's whole history,
    not only its last window: sensors are smoothed causally from a unit's first row.
    A unit with fewer rows than the window is front-padded with its first row and flagged
    `padded` (short_history="pad", the default), or rejected (short_history="reject").
    Units come out in the order they come in.
    """
    if short_history not in SHORT_HISTORY:
        raise ValueError(f"short_history must be one of {SHORT_HISTORY}, got {short_history!r}")
    check_horizon(horizon, preprocessor.rul_cap)
    rows = validate_rows(rows, source)
    ids, lengths = unit_lengths(rows["unit"].to_numpy())
    padded = lengths < preprocessor.window
    if short_history == "reject" and padded.any():
        listed = ", ".join(f"unit {u} has {n} rows" for u, n in zip(ids[padded], lengths[padded]))
        raise DataError(source, f"history shorter than the window ({preprocessor.window} "
                                f"cycles): {listed}")
    units, windows = preprocessor.last_windows(rows)
    networks = list(model) if isinstance(model, (list, tuple)) else [model]
    rul, spread = average_members(member_predictions(networks, windows))
    result = {"unit": units.astype(np.int64), "rul": rul}
    if interval is not None:
        result["rul_lower"], result["rul_upper"] = interval.bounds(rul, high=preprocessor.rul_cap)
        if interval.method == "banded":
            result["p_fail_within"] = interval.failure_probability(rul, horizon)
    frame = pd.DataFrame({**result, "padded": padded})
    if len(networks) > 1:
        frame["rul_std"] = spread
    return frame


def check_horizon(horizon, rul_cap: float) -> float:
    """`horizon` as a number of cycles, 0 < horizon < rul_cap (the RUL the model knows is capped:
    it cannot tell a failure past the cap from one at it); ValueError naming it otherwise."""
    try:
        value = float(horizon)
    except (TypeError, ValueError):
        value = None
    if value is None or isinstance(horizon, bool) or not 0 < value < rul_cap:
        raise ValueError(f"horizon must be a number of cycles between 0 and the model's RUL cap "
                         f"({rul_cap:g}), exclusive; got {horizon!r}")
    return value

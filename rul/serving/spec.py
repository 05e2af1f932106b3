"""What a logged model needs to predict, as one small JSON document (no torch, no pickle).

The inference spec holds the model kind, its architecture arguments, window, rul_cap,
n_features and a format version, the calibrated prediction interval
(rul.evaluation.conformal.Interval) when the model has one, `members` for an ensemble, and,
for models that run without torch: the fitted preprocessing as plain numbers
(rul.preprocessing.fitted), the envelope of the training fleet (rul.preprocessing.envelope)
and the members' ONNX files (`onnx`, names beside the spec). Loading ignores keys it does not
know and fills missing optional ones with their defaults, so a model registered today still
loads after config keys are added or renamed; a spec without `interval` (older models, or
interval_coverage: null) predicts no bounds. A "banded" interval also gives p_fail_within.

`layout` names the data set's columns (rul.data.layout: its unit and time columns, settings
and sensors); a spec without it (C-MAPSS's, and every model logged before layouts) reads
C-MAPSS's 26 columns.

`track` says what the model reads: the sensors alone ("sensors", comparable with published
figures) or the sensors and the engine's age ("sensors+age"); it follows from the fitted
preprocessing's columns, and specs written before it existed take it from there too.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from rul.data.layout import CMAPSS, Layout
from rul.evaluation.conformal import Interval
from rul.models.spec import ARCHITECTURE_ARGS, NetworkSpec
from rul.preprocessing.envelope import Envelope
from rul.preprocessing.features import AGE, track
from rul.preprocessing.fitted import FittedPreprocessing

FORMAT_VERSION = 1
SPEC_FILE = "inference_spec.json"


@dataclass(frozen=True)
class InferenceSpec:
    model: str  # a kind of rul.models.spec.NETWORK_KINDS
    window: int
    rul_cap: float
    n_features: int
    architecture: dict = field(default_factory=dict)  # build_network's keyword arguments
    format_version: int = FORMAT_VERSION
    interval: Interval | None = None  # None: the model predicts no bounds
    members: int = 1  # networks averaged (an ensemble); their weights are a list
    preprocessing: FittedPreprocessing | None = None  # None: a pickled Preprocessor (old)
    envelope: Envelope | None = None  # None: no unit is flagged
    onnx: tuple = ()  # each member's ONNX file, beside the spec
    track: str | None = None  # "sensors" or "sensors+age"; None: not known (an old spec)
    layout: Layout = CMAPSS  # the columns the model reads, under the data set's names

    @classmethod
    def from_network(cls, network, **trained) -> "InferenceSpec":
        """The spec of a trained rul.models.NetworkSpec, with what else training gives
        (`trained`: interval, members, preprocessing, envelope, onnx, layout); its track
        follows from the preprocessing."""
        return cls(network.kind, network.window, network.rul_cap, network.n_features,
                   dict(network.architecture), **trained,
                   track=_track_of(trained.get("preprocessing")))

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
        try:
            interval = _read(Interval, values.get("interval"))
            preprocessing = _read(FittedPreprocessing, values.get("preprocessing"))
            envelope = _read(Envelope, values.get("envelope"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"inference spec: {error}") from None
        members = int(values.get("members", 1))
        if members < 1:
            raise ValueError(f"inference spec: members must be >= 1, got {members}")
        onnx = tuple(str(name) for name in values.get("onnx") or ())
        if onnx and len(onnx) != members:
            raise ValueError(f"inference spec: {len(onnx)} ONNX files for {members} member(s)")
        found = values.get("track")
        try:
            layout = Layout.from_dict(values.get("layout"))
        except (KeyError, TypeError) as error:
            raise ValueError(f"inference spec: layout lacks {error}") from None
        return cls(str(values["model"]), int(values["window"]), float(values["rul_cap"]),
                   int(values["n_features"]), dict(values.get("architecture") or {}), version,
                   interval, members, preprocessing, envelope, onnx,
                   _track_of(preprocessing) if found is None else str(found), layout)

    @classmethod
    def read(cls, path: str | Path, defaults: dict | None = None) -> "InferenceSpec":
        return cls.from_dict(json.loads(Path(path).read_text()), defaults)

    def to_dict(self) -> dict:
        """The JSON's values; a single model without an interval, preprocessing numbers,
        envelope or ONNX files has exactly the keys specs had before those existed."""
        values = {"model": self.model, "window": self.window, "rul_cap": self.rul_cap,
                  "n_features": self.n_features, "architecture": dict(self.architecture),
                  "format_version": self.format_version}
        optional = {"interval": self.interval, "preprocessing": self.preprocessing,
                    "envelope": self.envelope}
        values.update({k: v.to_dict() for k, v in optional.items() if v is not None})
        if self.members != 1:
            values["members"] = self.members
        if self.onnx:
            values["onnx"] = list(self.onnx)
        if self.track is not None:
            values["track"] = self.track
        if self.layout != CMAPSS:
            values["layout"] = self.layout.to_dict()
        return values

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    def build_network(self):
        """A torch network of this architecture (imports torch)."""
        return NetworkSpec(self.model, self.n_features, self.window, self.rul_cap,
                           self.architecture).build()


def _track_of(preprocessing: FittedPreprocessing | None) -> str | None:
    return None if preprocessing is None else track(AGE in preprocessing.feature_columns)


def _read(kind, values):
    return None if values is None else kind.from_dict(values)

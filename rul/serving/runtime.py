"""The lean runtime: a logged model's folder (inference spec JSON + ONNX files) in, predictions
out, with numpy, pandas and onnxruntime only (no torch, no scikit-learn, no MLflow).

    from rul.serving.runtime import LeanModel
    model = LeanModel.load("path/to/model")   # an MLflow model folder, or its inference/ folder
    model.predict(rows)                       # raw rows (the data set's columns) -> per unit
    model.predict(rows, {"strict": True})     # the same parameters as the served model

The served pyfunc (rul.serving.lean_pyfunc) is this class behind MLflow's interface; `rul
predict` and rul's server load it directly (rul.serving.served), reading the folder as data. A
model folder carries the rul code it needs in code/ (MLflow's code_paths): with rul not
installed, put that folder on the path first (sys.path.insert(0, "path/to/model/code")).
"""

import os
from pathlib import Path

import numpy as np
import pandas as pd

from rul.serving import deadline
from rul.serving.predictor import ServedModel, predict_rows, unread
from rul.serving.spec import SPEC_FILE, InferenceSpec

RUNTIME_FOLDER = "inference"  # the pyfunc artifact holding the spec and the ONNX files
INPUT_NAME = "windows"  # (batch, window, features) float32 -> "rul" (batch,)
OUTPUT_NAME = "rul"
# Windows per onnxruntime call (one per unit: 100 FD001 test units are one call). Its arena
# grows to hold a call's activations and keeps them: 20,000 one-row engines (a 1.1 MB CSV)
# took +465 MB at 4096 windows a call, +164 MB at 1024, and were answered no slower.
CHUNK = 1024


TELEMETRY_ENV = "ORT_DISABLE_TELEMETRY"


def onnxruntime():
    """onnxruntime, imported with its telemetry off unless the environment says otherwise: its
    Linux wheels carry Microsoft's telemetry, on by default, which writes a device id and an
    event store under ~/.cache/Microsoft and a session file in the temporary folder, none of
    which a model's user asked for. Every import of onnxruntime in rul goes through here."""
    os.environ.setdefault(TELEMETRY_ENV, "1")
    import onnxruntime

    return onnxruntime


def runtime_folder(path: str | Path) -> Path:
    """The folder holding the inference spec: `path` itself, or an MLflow model folder's
    artifacts/inference; FileNotFoundError saying where it looked."""
    path = Path(path)
    for folder in (path, path / "artifacts" / RUNTIME_FOLDER, path / RUNTIME_FOLDER):
        if (folder / SPEC_FILE).is_file():
            return folder
    raise FileNotFoundError(f"{path}: no {SPEC_FILE} here nor in artifacts/{RUNTIME_FOLDER}/ "
                            "(a model folder of a rul model logged with ONNX networks)")


class LeanModel:
    """A loaded model: its spec and one onnxruntime session per ensemble member."""

    def __init__(self, spec: InferenceSpec, sessions: list):
        if spec.preprocessing is None:
            raise ValueError("inference spec lacks the fitted preprocessing: a model logged "
                             "before the lean runtime needs rul's torch environment")
        self.spec = spec
        self.sessions = sessions

    @classmethod
    def load(cls, path: str | Path, threads: int | None = None) -> "LeanModel":
        """Load from a model folder; `threads`: onnxruntime's intra-op threads (None: its
        default, one per core)."""
        ort = onnxruntime()
        folder = runtime_folder(path)
        spec = InferenceSpec.read(folder / SPEC_FILE)
        if not spec.onnx:
            raise ValueError(f"{folder / SPEC_FILE}: names no ONNX files")
        outside = [name for name in spec.onnx if Path(name).name != name or name in ("", "..")]
        if outside:  # the spec is data: it names files beside it, nothing elsewhere
            raise ValueError(f"{folder / SPEC_FILE}: ONNX file {outside[0]!r} is not a file "
                             "name beside the spec")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        sessions = [ort.InferenceSession(str(folder / name), options,
                                                 providers=["CPUExecutionProvider"])
                    for name in spec.onnx]
        return cls(spec, sessions)

    def member_predictions(self, windows: np.ndarray) -> np.ndarray:
        """RUL of each window by each member: shape (members, windows), float64; run in
        batches of CHUNK windows, a served request's deadline checked between them."""
        x = np.ascontiguousarray(windows, dtype=np.float32)
        out = np.empty((len(self.sessions), len(x)), dtype=np.float64)
        for start in range(0, len(x), CHUNK):
            for k, session in enumerate(self.sessions):
                deadline.check()
                out[k, start:start + CHUNK] = session.run(
                    [OUTPUT_NAME], {INPUT_NAME: x[start:start + CHUNK]})[0]
        return out

    @property
    def optional(self) -> tuple:
        """The sensors the model does not read: rows may leave them out."""
        return unread(self.spec.envelope)

    def predict(self, rows: pd.DataFrame, params: dict | None = None,
                source="input") -> pd.DataFrame:
        """One row per unit, the model's columns (rul.serving.columns). `params`:
        short_history ("pad" or "reject"), strict (refuse units outside the training fleet)
        and horizon (p_fail_within's cycles, default 20). Bad rows or parameters raise
        ValueError (rul.data.errors.DataError) naming row, column or unit."""
        spec = self.spec
        model = ServedModel(spec.preprocessing, self.member_predictions, spec.interval,
                            spec.envelope, spec.layout)
        return predict_rows(model, rows, source, params)

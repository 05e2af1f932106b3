"""A run's torch networks, for resuming, fine-tuning or comparing with the served ONNX model.

Every tracked run keeps its networks' weights beside the lean model: `weights/model.pt` (one
state dict) or `weights/ensemble.pt` (a list, one per member), and `weights/inference_spec.json`
(the architecture, the fitted preprocessing and the interval).

    from rul.serving.torch_weights import load_torch_model
    spec, networks = load_torch_model("<run id>")           # from the tracking store
    spec, networks = load_torch_model("path/to/weights")    # a downloaded weights/ folder
    rows -> rul.serving.predictor.predict_frame(spec.preprocessing, networks, rows,
                                                interval=spec.interval)
"""

from pathlib import Path

import torch

from rul.serving.spec import SPEC_FILE, InferenceSpec

WEIGHTS_FOLDER = "weights"
WEIGHT_FILES = ("model.pt", "ensemble.pt")


def load_networks(spec: InferenceSpec, weights_path) -> list[torch.nn.Module]:
    """The spec's networks in eval mode: one state dict, or a list of `spec.members`."""
    saved = torch.load(weights_path, map_location="cpu")
    states = saved if isinstance(saved, list) else [saved]
    if len(states) != spec.members:
        raise ValueError(f"{weights_path}: {len(states)} sets of weights for an inference spec "
                         f"of {spec.members} member(s)")
    networks = []
    for state in states:
        network = spec.build_network()
        network.load_state_dict(state)
        networks.append(network.eval())
    return networks


def load_torch_model(source: str | Path, tracking_uri: str | None = None
                     ) -> tuple[InferenceSpec, list[torch.nn.Module]]:
    """(spec, networks) of a run id or a local weights folder; FileNotFoundError when the
    folder holds no weights (runs logged before the spec was stored beside them have only
    model.pt: their spec is in the logged model's artifacts)."""
    folder = Path(source)
    if not folder.is_dir():
        import mlflow

        folder = Path(mlflow.artifacts.download_artifacts(
            run_id=str(source), artifact_path=WEIGHTS_FOLDER, tracking_uri=tracking_uri))
    weights = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights or not (folder / SPEC_FILE).is_file():
        raise FileNotFoundError(f"{folder}: expected {SPEC_FILE} and one of "
                                f"{', '.join(WEIGHT_FILES)}")
    spec = InferenceSpec.read(folder / SPEC_FILE)
    return spec, load_networks(spec, weights[0])

"""Export a trained torch network to ONNX for the lean runtime, and prove it computes the same.

torch.onnx.export with a dynamic batch axis (export_onnx): input `windows` (batch, window,
features) float32, output `rul` (batch,) in cycles, clamped to [0, rul_cap] like the network in
eval mode. Every export is checked through onnxruntime against the network (MAX_DIFFERENCE) on
noise and on real windows of the run's own validation data, and the served model against the
test RMSE the run printed (check_served).
"""

import contextlib
import copy
import hashlib
import logging
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from rul.data.layout import CMAPSS
from rul.evaluation.metrics import rul_metrics
from rul.files import CacheFile, cache_file
from rul.serving.runtime import INPUT_NAME, OUTPUT_NAME, LeanModel, onnxruntime
from rul.serving.spec import SPEC_FILE, InferenceSpec

MAX_DIFFERENCE = 1e-3  # cycles: the most an exported network may differ from torch
MAX_SERVED_DIFFERENCE = 0.01  # cycles of test RMSE: the served model against the printed one
PROBE_BATCH = 64
REAL_PROBES = 256  # validation windows each exported network is checked on


class ExportError(RuntimeError):
    """The ONNX network does not compute what the torch network computes."""


@contextlib.contextmanager
def _quiet():
    """The exporter's notes (skipped torchvision ops, deprecations) are not the user's."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export",
                                                     "torch._dynamo", "onnxscript")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# Unoptimized ONNX graphs of the architectures exported in this process, the newest last: an
# ensemble's members, a parent re-exporting them, a study's repeats share one graph.
_GRAPHS: OrderedDict[tuple, bytes] = OrderedDict()
KEPT_GRAPHS = 8
# ... and of those traced by any process, in the user's cache (rul.files.cache_folder()): a
# training process exports once and would otherwise trace its network every time.
GRAPH_CACHE = "onnx-graphs"


def export_onnx(network: torch.nn.Module, path: str | Path, window: int,
                n_features: int, real: np.ndarray | None = None) -> float:
    """Write `network` (any device; a CPU float32 copy is exported) as ONNX to `path`; return
    the largest difference in cycles from torch on noise and the `real` windows (ExportError
    above MAX_DIFFERENCE). The graph traced once per architecture is kept unoptimized and
    takes each network's weights before torch's optimization, so its file is byte for byte a
    fresh trace's; a kept graph that fails in any way is passed over (one warning line for the
    user cache's) and replaced by a new trace."""
    network = copy.deepcopy(network).cpu().float().eval()
    key = _comparable(_architecture(network, window, n_features))
    for graph, kept in _kept(key):
        try:
            _write(network, graph, path)
            difference = check_export(network, path, window, n_features, real)
        except Exception:  # noqa: BLE001 (not the network's graph after all: the next, or a trace)
            if kept is not None:
                kept.doubt("does not compute what the network computes")
            continue
        _remember(key, graph, on_disk=False)
        return difference
    graph = _trace(network, window, n_features)
    _write(network, graph, path)
    difference = check_export(network, path, window, n_features, real)  # raises: nothing kept
    _remember(key, graph, on_disk=True)
    return difference


def _comparable(key: tuple) -> tuple | None:
    try:
        hash(key)
    except TypeError:  # a setting that cannot be compared: traced each time
        return None
    return key


def _kept(key: tuple | None):
    """The graphs kept for `key`: this process's, then the user cache's, each with the cache
    file it came from (None: this process's)."""
    if key is None:
        return
    if key in _GRAPHS:
        yield _GRAPHS[key], None
    kept = _cache_file(key)
    graph = kept.read()
    if graph is not None:
        yield graph, kept


def _remember(key: tuple | None, graph: bytes, on_disk: bool) -> None:
    if key is None:
        return
    _GRAPHS[key] = graph
    _GRAPHS.move_to_end(key)
    while len(_GRAPHS) > KEPT_GRAPHS:
        _GRAPHS.popitem(last=False)
    if on_disk:
        _cache_file(key).keep(graph)


def _cache_file(key: tuple) -> CacheFile:
    """The cache file of an architecture's graph, for the exporter's versions: a new torch or
    onnxscript traces again."""
    import onnxscript

    named = repr((key, torch.__version__, onnxscript.__version__)).encode()
    return cache_file(f"{GRAPH_CACHE}/{hashlib.sha256(named).hexdigest()[:32]}.onnx")


def _trace(network: torch.nn.Module, window: int, n_features: int) -> bytes:
    """torch.onnx.export's graph of `network`, unoptimized: its initializers are the network's
    parameters and buffers by name (and any constant it holds otherwise)."""
    example = torch.zeros(2, window, n_features)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            network, (example,), None, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: torch.export.Dim("batch")},), dynamo=True, verbose=False,
            optimize=False)
    return program.model_proto.SerializeToString()


def _write(network: torch.nn.Module, graph: bytes, path: str | Path) -> None:
    """`graph` with `network`'s weights, optimized as torch.onnx.export optimizes, to `path`."""
    import onnx
    from onnxscript import ir

    program = torch.onnx.ONNXProgram(ir.from_proto(onnx.ModelProto.FromString(graph)), None)
    weights = {**dict(network.named_parameters()), **dict(network.named_buffers())}
    shapes = {name: tuple(value.shape) for name, value in program.model.graph.initializers.items()}
    if any(shapes.get(name) != tuple(t.shape) for name, t in weights.items()):
        raise ExportError(f"{path}: the ONNX graph does not take the network's weights")
    with _quiet(), torch.no_grad():
        program.apply_weights({name: t.detach() for name, t in weights.items()})
        program.optimize()
    program.save(str(path))


def _architecture(network: torch.nn.Module, window: int, n_features: int) -> tuple:
    """What a traced graph depends on besides the weights' values: the input's shape, each
    module's type and plain attributes, and each weight's name, shape and dtype."""
    plain = (bool, int, float, str, tuple, type(None))
    modules = tuple((name, type(m).__qualname__,
                     tuple(sorted((k, v) for k, v in vars(m).items()
                                  if not k.startswith("_") and isinstance(v, plain))))
                    for name, m in network.named_modules())
    tensors = tuple((name, tuple(t.shape), str(t.dtype))
                    for name, t in [*network.named_parameters(), *network.named_buffers()])
    return window, n_features, modules, tensors


def check_export(network: torch.nn.Module, path: str | Path, window: int,
                 n_features: int, real: np.ndarray | None = None) -> float:
    """The largest difference between the ONNX file and the network on a seeded batch of
    noise in the range the preprocessing produces (and somewhat beyond) and on `real` windows
    (the run's validation windows: smooth, as noise never is)."""
    noise = np.random.default_rng(0).uniform(-1.5, 1.5, (PROBE_BATCH, window, n_features))
    probes = {"noise": noise.astype(np.float32)}
    if real is not None and len(real):
        probes["real windows"] = np.ascontiguousarray(real, dtype=np.float32)
    session = onnxruntime().InferenceSession(str(path), providers=["CPUExecutionProvider"])
    largest = 0.0
    for what, probe in probes.items():
        exported = session.run([OUTPUT_NAME], {INPUT_NAME: probe})[0]
        with torch.inference_mode():
            expected = network(torch.from_numpy(probe)).numpy()
        difference = float(np.abs(exported.astype(np.float64) - expected).max())
        if not difference <= MAX_DIFFERENCE:
            raise ExportError(f"{path}: the ONNX network differs from torch by "
                              f"{difference:.3g} cycles on {what} (at most {MAX_DIFFERENCE} "
                              "allowed)")
        largest = max(largest, difference)
    return largest


def check_served(folder: str | Path, rows, scored, rul_cap: float, printed: float) -> float:
    """The served model in `folder` predicts the test `rows` (under the data set's names) and
    its test RMSE against `scored`'s true_rul is compared with the one the run `printed`;
    ExportError when they differ by more than MAX_SERVED_DIFFERENCE. Returns the difference."""
    served = LeanModel.load(folder).predict(rows)
    if not np.array_equal(served.iloc[:, 0].to_numpy(), scored["unit"].to_numpy()):
        raise ExportError(f"{folder}: the served model answers for other test units than "
                          "were scored")
    rmse = rul_metrics(served["rul"].to_numpy(), scored["true_rul"].to_numpy(), rul_cap)["rmse"]
    difference = abs(rmse - printed)
    if not difference <= MAX_SERVED_DIFFERENCE:
        raise ExportError(f"{folder}: the served model's test RMSE is {rmse:.3f}, the run's "
                          f"{printed:.3f} (at most {MAX_SERVED_DIFFERENCE} apart)")
    return difference


def save_runtime(folder: str | Path, network_spec, networks: list, preprocessor,
                 interval=None, data=None) -> InferenceSpec:
    """Write what the lean runtime loads into `folder` and return its spec: each network as ONNX
    (network.onnx, or member_<i>.onnx), checked on noise and, given the prepared `data` the
    networks trained on, on REAL_PROBES of its validation windows, and the inference spec (the
    fitted preprocessing's numbers, the envelope, the interval, the data set's layout: C-MAPSS
    without `data`)."""
    layout = data.subset.layout if data is not None else CMAPSS
    real = data.val.spread(REAL_PROBES) if data is not None else None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    members = len(networks)
    names = ["network.onnx"] if members == 1 else [f"member_{i}.onnx" for i in range(members)]
    for network, name in zip(networks, names):
        export_onnx(network, folder / name, network_spec.window, network_spec.n_features, real)
    spec = InferenceSpec.from_network(
        network_spec, interval=interval, members=members, preprocessing=preprocessor.fitted(),
        envelope=preprocessor.envelope_, onnx=tuple(names), layout=layout)
    spec.write(folder / SPEC_FILE)
    return spec

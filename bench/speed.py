"""`python -m bench speed`: samples/s of the default training step (`make train`'s DCNN,
effective batch 512 = 256 x 2, AdamW, clipping: rul.training.step.optimizer_step) on each
candidate path, measured in interleaved rounds on this machine; the median of each, as a ratio
to the plain fp32 eager path of the same device. The last line is `speed ratio: R`: the path
`precision: auto` picks here (rul.training.hardware) over the reference: on CPU the plain fp32
eager DCNN as it was before the speed work, on CUDA fp32 eager.

Paths (CPU; and CUDA fp32, fp16 + GradScaler, bf16 when a GPU is present):
  fp32 eager            today's DCNN: channels_last (k, 1) convolutions (oneDNN's fast path),
                        each even-kernel layer's trim fused into its tanh, on CPU tanh computed
                        as 2 sigmoid(2x) - 1 (models/cnn.py)
  fp32 eager, exact tanh  the same with torch.tanh (the fusion alone: bit for bit `before`)
  fp32 eager, before    the reference: the DCNN as it was (slice, then nn.Tanh: autograd's
                        copies around the slice), the same numbers bit for bit
  fp32 eager, NCHW      the textbook layout (and slice + nn.Tanh), for comparison
  bf16 autocast         slow without native bf16 (AVX512-BF16/AMX), which this bench reports
  fp32 torch.compile    only with --compile (~10-30 s of compilation, shown as setup_s)

Imports neither mlflow, optuna nor pydantic: the model is built from plain values (as in
bench/memory.py) and the windows are synthetic (only shapes matter for speed).
"""

import statistics
import time

import torch
from torch import nn

from bench.memory import DEFAULT_MODEL, N_FEATURES, BenchPrecision
from rul.models import build_model
from rul.models.cnn import TimeConv, TrimmedTanh
from rul.training.hardware import auto_precision, cpu_has_native_bf16
from rul.training.step import optimizer_step

B, MICRO = 512, 256  # the default effective batch and its split


class NCHWTimeConv(TimeConv):
    """TimeConv on contiguous NCHW tensors (the layout a textbook model uses)."""

    def forward(self, x):
        return super().forward(x.contiguous())


def as_before(features: nn.Sequential, conv_class=TimeConv) -> nn.Sequential:
    """A DCNN's layers as they were before the speed work, same weights, in place: each
    TimeConv trims its own output, then nn.Tanh (instead of TrimmedTanh)."""
    for i, layer in enumerate(features):
        if isinstance(layer, TimeConv):
            sliced = conv_class(layer.in_channels, layer.out_channels, layer.kernel_size[0])
            sliced.load_state_dict(layer.state_dict())
            features[i] = sliced
        elif isinstance(layer, TrimmedTanh):
            features[i] = nn.Tanh()
    return features


def default_model(kind: str) -> nn.Module:
    """The default DCNN (kind "default"), with torch.tanh in its fused layers ("exact"), as it
    was before the speed work ("before") or that and NCHW ("nchw"); same weights."""
    torch.manual_seed(0)
    model = build_model(DEFAULT_MODEL, N_FEATURES)
    features = model.backbone.features
    for layer in features:
        if isinstance(layer, TrimmedTanh):
            layer.exact = kind == "exact"
    if kind in ("before", "nchw"):
        as_before(features, NCHWTimeConv if kind == "nchw" else TimeConv)
    memory_format = torch.contiguous_format if kind == "nchw" else torch.channels_last
    features.to(memory_format=memory_format)
    return model


class Path:
    """One way to run the default step: a model, its optimizer and a precision."""

    def __init__(self, label: str, kind: str, device: str, precision: str,
                 compiled: bool = False):
        self.label, self.device = label, torch.device(device)
        self.precision = BenchPrecision(self.device, precision)
        self.model = default_model(kind).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.scaler = self.precision.grad_scaler()
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(B, DEFAULT_MODEL.window, N_FEATURES, generator=gen)
        y = torch.rand(B, generator=gen) * DEFAULT_MODEL.rul_cap
        self.batches = list(zip(x.to(self.device).split(MICRO), y.to(self.device).split(MICRO),
                                strict=True))
        started = time.perf_counter()
        if compiled:
            self.model = torch.compile(self.model)
        self.step()  # warm-up (and compilation): one-time costs are not in samples/s
        self.setup_seconds = time.perf_counter() - started
        self.rates: list[float] = []

    def step(self) -> None:
        optimizer_step(self.model, self.optimizer, self.scaler, self.batches, self.precision,
                       1.0, DEFAULT_MODEL.rul_cap)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_steps(self, steps: int) -> None:
        started = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.rates.append(B * steps / (time.perf_counter() - started))

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def paths(compile_too: bool) -> tuple[list[Path], Path, Path, str]:
    """(every path, the reference, auto's path, auto's reason) on the fastest
    device here (CUDA when present: ratios compare paths on one device)."""
    every = [Path("cpu fp32 eager, before", "before", "cpu", "fp32"),
             Path("cpu fp32 eager, exact tanh", "exact", "cpu", "fp32"),
             Path("cpu fp32 eager", "default", "cpu", "fp32"),
             Path("cpu fp32 eager, NCHW", "nchw", "cpu", "fp32"),
             Path("cpu bf16 autocast", "default", "cpu", "bf16")]
    if compile_too:
        every.append(Path("cpu fp32 torch.compile", "default", "cpu", "fp32", compiled=True))
    if torch.cuda.is_available():
        every += [Path(f"cuda {p}", "default", "cuda", p) for p in ("fp32", "fp16", "bf16")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chosen, reason = auto_precision(device)
    by_label = {path.label: path for path in every}
    reference = "cuda fp32" if device.type == "cuda" else "cpu fp32 eager, before"
    return every, by_label[reference], by_label[label(device, chosen)], reason


def label(device: torch.device, precision: str) -> str:
    if device.type == "cuda":
        return f"cuda {precision}"
    return "cpu fp32 eager" if precision == "fp32" else "cpu bf16 autocast"


def bench_speed(quick: bool = False, compile_too: bool = False) -> None:
    rounds, steps = (3, 2) if quick else (7, 4)
    every, reference, default, reason = paths(compile_too)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"speed: default DCNN step, B={B} as {MICRO}x{B // MICRO}, {rounds} interleaved "
          f"rounds of {steps} steps; {torch.get_num_threads()} CPU threads, {gpu}, "
          f"torch {torch.__version__}")
    for _ in range(rounds):
        for path in every:
            path.time_steps(steps)
    print(f"{'path':28} {'samples/s':>10} {'min':>8} {'max':>8} {'ratio':>6} {'setup_s':>8}")
    for path in every:
        print(f"{path.label:28} {path.median:10.0f} {min(path.rates):8.0f} "
              f"{max(path.rates):8.0f} {path.median / reference.median:6.2f} "
              f"{path.setup_seconds:8.1f}")
    print(f"precision: auto here = {default.label} ({reason}); native bf16 CPU: "
          f"{cpu_has_native_bf16()}")
    print(f"speed ratio: {default.median / reference.median:.2f}")

"""`python -m bench speed`: samples/s of `make train`'s training step (its DCNN, optimizer,
effective batch and split, clipping: rul.plan.recipe_step, from the recipe's one home; the step
rul.training.step.optimizer_step) on each candidate path, measured in interleaved rounds on
this machine; the median of each, as a ratio to the reference on the same device. The last
line is `speed ratio: R`: the path `rul train` takes here with `precision: auto`
(rul.training.precision) over the reference: on CPU the plain
fp32 eager DCNN as it was before the speed work, on CUDA fp32 eager.

Each path runs in a process of its own, started once: its heap, caches, threads and malloc
settings do not leak into the others' (in one process, paths measured side by side moved each
other's figures by 10-30 %). The rounds run one path at a time, the others waiting.

Paths (CPU; and CUDA fp32, fp16 + GradScaler, bf16 when a GPU is present):
  fp32 eager, before    the reference: channels_last (k, 1) convolutions (oneDNN), each layer's
                        output sliced, then nn.Tanh; nn.Dropout (bernoulli_ masks); glibc's
                        default malloc settings
  fp32 eager, conv      the convolutions with each even-kernel layer's trim fused into its tanh
                        and tanh as 2 sigmoid(2x) - 1 (the default until the banded products)
  fp32 banded, std malloc  the layers as banded matrix products (models/banded.py)
  fp32 eager            what `rul train` runs on a CPU without native bf16: the banded
                        products, malloc keeping freed memory (hardware.keep_freed_memory)
  bf16 autocast, bernoulli_  as below with nn.Dropout's masks (before models/dropout.py; the
                        rows above but the reference draw their masks as `rul train` does)
  bf16 autocast         the convolutions under bf16 autocast, malloc keeping freed memory:
                        what `rul train` runs on a CPU with native bf16 (AVX512-BF16/AMX);
                        emulated and ~0.15x fp32 without it
  bf16 autocast, std malloc  as above with glibc's default malloc settings: what keeping
                        freed memory is worth under bf16 (only where bf16 is native)
  fp32 torch.compile    only with --compile (compilation time shown as setup_s)

The windows are synthetic (only shapes matter for speed).
"""

import contextlib
import multiprocessing
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from rul.models.cnn import TimeConv, TrimmedTanh
from rul.plan import cpu_measured, recipe_step
from rul.training.hardware import cpu_has_native_bf16, keep_freed_memory
from rul.training.optim import make_optimizer
from rul.training.precision import auto_precision, resolve_precision
from rul.training.step import optimizer_step

RECIPE = recipe_step()
B, MICRO = RECIPE.effective_batch_size, RECIPE.micro_batch_size


def with_bernoulli_dropout(dcnn: nn.Module) -> nn.Module:
    """The DCNN with nn.Dropout (masks from bernoulli_) in its head again, in place."""
    head = dcnn.head
    for i, layer in enumerate(head):
        if isinstance(layer, nn.Dropout):
            head[i] = nn.Dropout(layer.p)
    return dcnn


def as_before(features: nn.Sequential) -> nn.Sequential:
    """A DCNN's layers as they were before the speed work, same weights, in place: each
    TimeConv trims its own output, then nn.Tanh (instead of TrimmedTanh). The DCNN must also
    take its convolutions (`banded = False`) and nn.Dropout (with_bernoulli_dropout)."""
    for i, layer in enumerate(features):
        if isinstance(layer, TimeConv):
            sliced = TimeConv(layer.in_channels, layer.out_channels, layer.kernel_size[0])
            sliced.load_state_dict(layer.state_dict())
            features[i] = sliced
        elif isinstance(layer, TrimmedTanh):
            features[i] = nn.Tanh()
    return features


def default_model(kind: str) -> nn.Module:
    """The default DCNN: as `rul train` builds it ("default"), with nn.Dropout ("bernoulli"),
    on its convolutions ("conv"), or as it was before the speed work ("before"); same
    weights."""
    torch.manual_seed(0)
    model = RECIPE.network.build()
    model.backbone.banded = kind in ("default", "bernoulli")
    if kind in ("before", "bernoulli"):
        with_bernoulli_dropout(model.backbone)
    if kind == "before":
        as_before(model.backbone.features).to(memory_format=torch.channels_last)
    return model


@dataclass(frozen=True)
class PathSpec:
    """One way to run the default step: a model, a device, a precision, malloc's settings."""

    label: str
    kind: str  # default_model's
    device: str
    precision: str
    keep_freed_memory: bool = False
    compiled: bool = False


class Path:
    """A path's model, optimizer and batches, in the process that measures it."""

    def __init__(self, spec: PathSpec):
        if spec.keep_freed_memory:
            keep_freed_memory()
        self.device = torch.device(spec.device)
        self.precision = resolve_precision(spec.precision, self.device)
        self.settings = RECIPE.settings(self.precision)
        self.model = default_model(spec.kind).to(self.device)
        self.optimizer = make_optimizer(self.model, RECIPE.optimizer(self.precision))  # as training
        self.scaler = self.precision.grad_scaler()
        self.batches = RECIPE.micro_batches(self.device)
        started = time.perf_counter()
        if spec.compiled:
            self.model = torch.compile(self.model)
        for _ in range(2):  # warm-up (and compilation): one-time costs are not in samples/s
            self.step()
        self.setup_seconds = time.perf_counter() - started

    def step(self) -> None:
        optimizer_step(self.model, self.optimizer, self.scaler, self.batches, self.settings)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def samples_per_second(self, steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            self.step()
        return B * steps / (time.perf_counter() - started)


def _serve(spec: PathSpec, conn) -> None:
    """A path's process: build it, then time `steps` steps per request until told to stop."""
    path = Path(spec)
    conn.send(path.setup_seconds)
    while (steps := conn.recv()) is not None:
        conn.send(path.samples_per_second(steps))


class PathProcess:
    """A path in its own process (spawned: nothing inherited from this one)."""

    def __init__(self, spec: PathSpec, context):
        self.spec, self.rates = spec, []
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(spec, child), daemon=True)
        self.process.start()
        child.close()
        try:
            self.setup_seconds = self._answer()
        except BaseException:
            self.close()
            raise

    def time_steps(self, steps: int) -> None:
        self.conn.send(steps)
        self.rates.append(self._answer())

    def _answer(self, timeout_s: float = 900):
        """The process's reply; EOFError if it died, TimeoutError if it hangs."""
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"bench speed: path {self.spec.label!r} gave no answer in "
                               f"{timeout_s:.0f} s")
        return self.conn.recv()

    def close(self) -> None:
        """Stop the process, also one that died or hangs."""
        with contextlib.suppress(OSError, EOFError):
            self.conn.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def path_specs(compile_too: bool) -> list[PathSpec]:
    specs = [PathSpec("cpu fp32 eager, before", "before", "cpu", "fp32"),
             PathSpec("cpu fp32 eager, conv", "conv", "cpu", "fp32"),
             PathSpec("cpu fp32 banded, std malloc", "default", "cpu", "fp32"),
             PathSpec("cpu fp32 eager", "default", "cpu", "fp32", keep_freed_memory=True),
             PathSpec("cpu bf16 autocast, bernoulli_", "bernoulli", "cpu", "bf16",
                      keep_freed_memory=True),
             PathSpec("cpu bf16 autocast", "default", "cpu", "bf16", keep_freed_memory=True)]
    if cpu_has_native_bf16():  # emulated bf16 is not a path anyone takes
        specs.append(PathSpec("cpu bf16 autocast, std malloc", "default", "cpu", "bf16"))
    if compile_too:
        specs.append(PathSpec("cpu fp32 torch.compile", "default", "cpu", "fp32",
                              keep_freed_memory=True, compiled=True))
    if torch.cuda.is_available():
        specs += [PathSpec(f"cuda {p}", "default", "cuda", p) for p in ("fp32", "fp16", "bf16")]
    return specs


def label(device: torch.device, precision: str) -> str:
    """The path `rul train` takes with `precision` on `device`."""
    if device.type == "cuda":
        return f"cuda {precision}"
    return "cpu fp32 eager" if precision == "fp32" else "cpu bf16 autocast"


def bench_speed(quick: bool = False, compile_too: bool = False) -> dict:
    rounds, steps = (3, 2) if quick else (9, 4)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chosen, reason = auto_precision(device, "cnn", cpu_measured)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"speed: make train's step ({RECIPE.optimization.kind}), B={B} as "
          f"{MICRO}x{B // MICRO}, {rounds} interleaved "
          f"rounds of {steps} steps, one process per path; {torch.get_num_threads()} CPU "
          f"threads, {gpu}, torch {torch.__version__}")
    context = multiprocessing.get_context("spawn")
    every = []
    try:
        for spec in path_specs(compile_too):
            every.append(PathProcess(spec, context))
        for _ in range(rounds):
            for path in every:
                path.time_steps(steps)
    finally:
        for path in every:
            path.close()
    by_label = {path.spec.label: path for path in every}
    reference = by_label["cuda fp32" if device.type == "cuda" else "cpu fp32 eager, before"]
    print(f"{'path':30} {'samples/s':>10} {'min':>8} {'max':>8} {'ratio':>6} {'setup_s':>8}")
    for path in every:
        print(f"{path.spec.label:30} {path.median:10.0f} {min(path.rates):8.0f} "
              f"{max(path.rates):8.0f} {path.median / reference.median:6.2f} "
              f"{path.setup_seconds:8.1f}")
    default = by_label[label(device, chosen)]
    print(f"precision: auto here = {default.spec.label} ({reason}); native bf16 CPU: "
          f"{cpu_has_native_bf16()}")
    print(f"speed ratio: {default.median / reference.median:.2f}")
    return {"columns": ["path", "samples/s", "min", "max", "ratio to reference", "setup s"],
            "rows": [[p.spec.label, round(p.median), round(min(p.rates)), round(max(p.rates)),
                      round(p.median / reference.median, 2), round(p.setup_seconds, 1)]
                     for p in every],
            "summary": {"speed ratio": round(default.median / reference.median, 2),
                        "precision: auto here": default.spec.label},
            "note": f"{rounds} interleaved rounds of {steps} steps, one process per path"}

"""`python -m bench memory`: peak memory and speed of one effective batch B = 512 split into
micro-batches of 512, 256, 128 and 64 (K = 1, 2, 4, 8), per precision, each as a ratio to
(512, 1). fp32 and bf16 on CPU; fp32, fp16 and bf16 on CUDA when there is a GPU.

Imports neither mlflow, optuna nor pydantic (GPU machines here have torch, numpy, pandas,
scikit-learn, PyYAML and tqdm only): the default CNN of `make train` is built from its plain
description (rul.models.spec), and the windows are synthetic (only shapes matter for memory
and speed). Peak memory is measured as rul.training.peak_memory says (CUDA:
max_memory_allocated; CPU: the process's resident-set high-water mark), for a whole optimizer
step over the K micro-batches, with the model, its gradients and AdamW's state counted.
"""

import os
from types import SimpleNamespace

import torch

from rul.models.spec import NetworkSpec
from rul.training.hardware import keep_freed_memory
from rul.training.micro_batch import measure_step
from rul.training.optim import make_optimizer
from rul.training.precision import Precision, resolve_precision
from rul.training.step import StepSettings

B, MICROS = 512, (512, 256, 128, 64)
# experiments/fd001.yaml's inputs: FD001's 14 informative sensors and the engine's age;
# `--sensors-only` (bench/__main__.py) sets 14, the model the recorded figures before it timed
N_FEATURES = int(os.environ.get("RUL_BENCH_FEATURES", 15))
DEFAULT_MODEL = NetworkSpec(n_features=N_FEATURES)  # experiments/fd001.yaml's model
OPTIMIZER = SimpleNamespace(optimizer="adamw", lr=1e-3, weight_decay=0.01,
                            scheduler="none")  # torch's AdamW defaults


def measure(precision: Precision, micro: int, steps: int) -> tuple[int, float]:
    """(peak bytes of the first step, samples/s over `steps` more) for B split by `micro`."""
    device = precision.device
    torch.manual_seed(0)
    x = torch.randn(B, DEFAULT_MODEL.window, N_FEATURES, device=device)
    y = torch.rand(B, device=device) * DEFAULT_MODEL.rul_cap
    micro_batches = list(zip(x.split(micro), y.split(micro), strict=True))
    model = DEFAULT_MODEL.build().to(device)
    optimizer = make_optimizer(model, OPTIMIZER)  # as training makes it (fused on CUDA)
    scaler = precision.grad_scaler()
    settings = StepSettings(precision, 1.0, DEFAULT_MODEL.rul_cap)
    peak, _ = measure_step(model, optimizer, scaler, micro_batches, settings)
    seconds = sum(measure_step(model, optimizer, scaler, micro_batches, settings)[1]
                  for _ in range(steps))
    return peak, B * steps / seconds if steps else 0.0


def bench_memory(quick: bool = False) -> dict:
    keep_freed_memory()  # as `rul train` on a CPU, before its memory probe
    runs = [("cpu", p) for p in ("fp32", "bf16")]
    if torch.cuda.is_available():
        runs += [("cuda", p) for p in ("fp32", "fp16", "bf16")]
    steps = 1 if quick else 5
    name = (torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
    print(f"memory: B={B}, default CNN (window 30, {N_FEATURES} features), one AdamW step per row; "
          f"{torch.get_num_threads()} CPU threads, {name}, torch {torch.__version__}")
    print(f"{'device':6} {'prec':5} {'micro':>5} {'K':>2} {'peak_MiB':>9} {'samples/s':>10} "
          f"{'peak/1x512':>10} {'speed/1x512':>11}")
    rows = []
    for device, name in runs:
        precision = resolve_precision(name, torch.device(device))
        measure(precision, MICROS[-1], 0)  # warm-up: one-time initialisation not counted
        reference = None
        for micro in MICROS:
            peak, rate = measure(precision, micro, steps)
            reference = reference or (peak, rate)
            print(f"{device:6} {name:5} {micro:5d} {B // micro:2d} {peak / 2**20:9.1f} "
                  f"{rate:10.0f} {peak / reference[0]:10.2f} {rate / reference[1]:11.2f}")
            rows.append([device, name, f"{micro} x {B // micro}", round(peak / 2**20, 1),
                         round(rate), round(peak / reference[0], 2),
                         round(rate / reference[1], 2)])
    return {"columns": ["device", "precision", "micro x K", "peak MiB", "samples/s",
                        f"peak / ({B}x1)", f"speed / ({B}x1)"], "rows": rows,
            "note": f"effective batch {B}, {N_FEATURES} inputs, one AdamW step per row"}

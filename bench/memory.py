"""`python -m bench memory`: peak memory and speed of `make train`'s step (its network,
optimizer and effective batch B: rul.plan.recipe_step, from the recipe's one home) with B split
into micro-batches of B, B/2, B/4 and B/8, per precision, each as a ratio to (B, 1). fp32 and
bf16 on CPU; fp32, fp16 and bf16 on CUDA when there is a GPU.

The windows are synthetic (only shapes matter for memory and speed). Peak memory is measured
as rul.training.peak_memory says (CUDA: max_memory_allocated; CPU: the process's resident-set
high-water mark), for a whole optimizer step over the K micro-batches, with the model, its
gradients and the optimizer's state counted.
"""

import dataclasses

import torch

from rul.plan import recipe_step
from rul.training.hardware import keep_freed_memory
from rul.training.micro_batch import measure_step
from rul.training.optim import make_optimizer
from rul.training.precision import Precision, resolve_precision

RECIPE = recipe_step()
B = RECIPE.effective_batch_size
MICROS = (B, B // 2, B // 4, B // 8)


def measure(precision: Precision, micro: int, steps: int) -> tuple[int, float]:
    """(peak bytes of the first step, samples/s over `steps` more) for B split by `micro`."""
    device = precision.device
    torch.manual_seed(0)
    micro_batches = dataclasses.replace(RECIPE, micro_batch_size=micro).micro_batches(device)
    model = RECIPE.network.build().to(device)
    optimizer = make_optimizer(model, RECIPE.optimizer(precision))  # as training makes it
    scaler = precision.grad_scaler()
    settings = RECIPE.settings(precision)
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
    net = RECIPE.network
    print(f"memory: make train's step, B={B}, {net.kind} (window {net.window}, "
          f"{net.n_features} inputs), {RECIPE.optimization.kind}, one step per row; "
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
            "note": f"make train's step: effective batch {B}, {RECIPE.network.n_features} "
                    f"inputs, {RECIPE.optimization.kind}, one step per row"}

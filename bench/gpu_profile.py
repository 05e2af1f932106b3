"""Where the default recipe's time goes on a GPU: `make gpu-check`'s profile section.

Two short profiled trainings of the default recipe at precision auto (seed 42): one as it runs
(each step replayed from its CUDA graph), one with the same steps run eagerly (each kernel
launched from Python). From each: the kernels per optimizer step, the share of the wall time
the GPU spends in kernels (near 1: the kernels' own time bounds the run, so fewer or fused
kernels pay; well under 1: the host's work between them does, e.g. each epoch's end), and the
kernels that take the most time, written in full to `profile.txt` beside the JSON result.
"""

import time
from pathlib import Path
from unittest import mock

import torch

EPOCHS = 6


def _kernels(profiler) -> list:
    """The GPU kernels (and copies) the profiler saw."""
    device = torch.autograd.DeviceType.CUDA
    return [e for e in profiler.events() if e.device_type == device]


def profiled(train_once, graphs: bool) -> dict:
    """`train_once()` -> (outcome, seconds) under torch.profiler, with or without the CUDA
    graph: kernels per step, GPU busy share, the top kernels' table."""
    from torch.profiler import ProfilerActivity, profile

    from rul.training import cuda_graph

    with mock.patch.object(cuda_graph, "ENABLED", graphs), \
            profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        outcome, _ = train_once()
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernels = _kernels(profiler)
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)
    steps = _steps(outcome)
    try:
        table = profiler.key_averages().table(sort_by="self_device_time_total", row_limit=30)
    except (KeyError, AttributeError, RuntimeError):
        table = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
    return {"graphs": graphs, "wall_s": wall, "kernels": len(kernels), "steps": steps,
            "kernels_per_step": len(kernels) / max(steps, 1), "busy": busy_us / 1e6 / wall,
            "table": table}


def _steps(outcome) -> int:
    """Optimizer steps the outcome's training took (its epochs x steps per epoch)."""
    from rul.training.optim import steps_per_epoch

    plan = outcome.plan
    return len(outcome.state.history) * steps_per_epoch(len(plan.data.train),
                                                        plan.global_batch_size)


def write_tables(results: list[dict], folder: Path | None) -> None:
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    text = []
    for result in results:
        text += [f"## {'CUDA graph' if result['graphs'] else 'eager steps'}: "
                 f"{result['wall_s']:.2f} s wall, {result['steps']} steps, "
                 f"{result['kernels_per_step']:.0f} kernels per step, GPU busy "
                 f"{result['busy']:.0%}", result["table"], ""]
    (folder / "profile.txt").write_text("\n".join(text))

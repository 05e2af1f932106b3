"""Measured peak memory of one training step per micro-batch size, and the split it allows.

With exact accumulation the model depends only on the effective batch B; the micro-batch
size only decides memory and speed. `probe` measures, for each candidate micro size, the peak
memory of one real `optimizer_step` (forward + backward + optimizer step at the run's
precision, on a fresh model and optimizer, so the optimizer's state is counted too);
`choose_split` picks the largest candidate whose peak fits the budget (largest = fewest
micro-batches per step, which is also the fastest on every device measured; see docs: The
training step) and
K = ceil(B / micro): the last micro-batch may be short, the step weights samples exactly.

How peak memory is measured:
- CUDA: torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats: the peak of
  torch's allocator, the figure that runs out first on a GPU.
- CPU: the process's resident set size, measured by the kernel. Freed heap memory is handed
  back first (glibc malloc_trim), the high-water mark is reset (`5` into
  /proc/self/clear_refs), and peak = VmHWM after the step - VmRSS before the model was built.
  This counts every byte the step made resident (torch's CPU allocator, oneDNN scratch,
  Python objects), which tracemalloc cannot see (torch allocates outside Python's allocator)
  and the profiler's memory events did not record for these CPU ops. Needs Linux; elsewhere
  the CPU peak is ru_maxrss growth, which can only under-count a smaller step after a larger.
"""

import contextlib
import ctypes
import gc
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from rul.training.step import optimizer_step

MIN_CANDIDATE = 8
CUDA_MARGIN = 0.10  # default CUDA budget: free memory less 10% (allocator fragmentation)
CPU_SHARE = 0.5  # default CPU budget: half of the memory available when the probe starts


class MemoryBudgetError(ValueError):
    """No micro-batch size fits the memory budget."""


@dataclass(frozen=True)
class ProbeRow:
    micro_batch_size: int
    peak_bytes: int
    seconds_per_step: float

    @property
    def samples_per_second(self) -> float:
        return self.micro_batch_size / self.seconds_per_step


def candidates(effective_batch_size: int, smallest: int = MIN_CANDIDATE) -> list[int]:
    """B itself, then halvings of it down to `smallest` (B=512: 512, 256, ..., 8)."""
    sizes, size = [], effective_batch_size
    while size >= smallest or not sizes:
        sizes.append(size)
        size //= 2
    return sizes


def probe(model_factory, sample_batch, precision, candidate_sizes, optimizer_factory=None,
          max_grad_norm: float | None = 1.0, target_scale: float = 1.0,
          stop_above: int | None = None) -> list[ProbeRow]:
    """Peak memory and time of one optimizer step per micro size, smallest first.

    `model_factory()` builds a fresh model on the training device; `sample_batch` (x, y) holds
    at least max(candidate_sizes) samples; `optimizer_factory(model)` defaults to AdamW.
    A candidate that runs out of memory is recorded with peak_bytes = -1 (it does not fit).
    With `stop_above` (a budget), the larger candidates are skipped once one exceeds it.
    """
    make_optimizer = optimizer_factory or (lambda m: torch.optim.AdamW(m.parameters()))
    x, y = sample_batch
    device = x.device
    rng = _rng_state(device)  # the probe must not move the run's random streams
    try:
        first = min(candidate_sizes)  # warm-up: one-time lazy initialisation is not a cost
        _measure(model_factory, make_optimizer, precision, x[:first], y[:first], max_grad_norm,
                 target_scale)
        rows = []
        for size in sorted(candidate_sizes):
            try:
                peak, seconds = _measure(model_factory, make_optimizer, precision, x[:size],
                                         y[:size], max_grad_norm, target_scale)
            except torch.OutOfMemoryError:
                peak, seconds = -1, math.inf
            rows.append(ProbeRow(size, peak, seconds))
            if stop_above is not None and not 0 <= peak <= stop_above:
                break
        return rows
    finally:
        _set_rng_state(device, rng)


def choose_split(effective_batch_size: int, budget: int, table: list[ProbeRow]
                 ) -> tuple[int, int]:
    """(micro, K): the largest measured micro size whose peak fits `budget`, K = ceil(B/micro)."""
    fits = [row for row in table if 0 <= row.peak_bytes <= budget
            and row.micro_batch_size <= effective_batch_size]
    if not fits:
        measured = [row for row in table if row.peak_bytes >= 0]
        smallest = min(measured, key=lambda row: row.peak_bytes) if measured else None
        detail = (f"the smallest measured peak is {format_bytes(smallest.peak_bytes)} at "
                  f"micro_batch_size={smallest.micro_batch_size}" if smallest
                  else "every candidate ran out of memory")
        raise MemoryBudgetError(f"memory_budget={format_bytes(budget)}: below every candidate "
                                f"micro-batch size ({detail})")
    micro = max(row.micro_batch_size for row in fits)
    return micro, math.ceil(effective_batch_size / micro)


def default_budget(device: torch.device) -> int:
    """CUDA: free device memory less CUDA_MARGIN; CPU: CPU_SHARE of MemAvailable (Linux) or
    of physical memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * (1 - CUDA_MARGIN))
    available = _proc_kib("/proc/meminfo", "MemAvailable:")
    if available is None:
        available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(available * CPU_SHARE)


def table_rows(table: list[ProbeRow]) -> list[dict]:
    """The probe table as plain dicts (for MLflow's log_table)."""
    return [{**asdict(row), "peak_mib": round(row.peak_bytes / 2**20, 2),
             "samples_per_second": round(row.samples_per_second, 1)} for row in table]


def format_bytes(size: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f}{unit}"
    return f"{size}B"


# ------------------------------------------------------------------ measurement


def _measure(model_factory, make_optimizer, precision, x, y, max_grad_norm, target_scale):
    baseline = _reset_peak(x.device)
    model = model_factory()
    model.train()
    return measure_step(model, make_optimizer(model), precision.grad_scaler(), [(x, y)],
                        precision, max_grad_norm, target_scale, baseline)


def measure_step(model, optimizer, scaler, micro_batches, precision, max_grad_norm=1.0,
                 target_scale=1.0, baseline: int | None = None) -> tuple[int, float]:
    """(peak bytes, seconds) of one optimizer_step over `micro_batches`, measured as the
    module docstring says; `baseline` is the memory reading peaks count from (default: now)."""
    device = precision.device
    if baseline is None:
        baseline = _reset_peak(device)
    started = time.perf_counter()
    optimizer_step(model, optimizer, scaler, micro_batches, precision, max_grad_norm,
                   target_scale)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return _peak(device) - baseline, seconds


def _reset_peak(device: torch.device) -> int:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return 0  # CUDA peaks are absolute: what the budget competes with
    _trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    return _proc_kib("/proc/self/status", "VmRSS:") or _maxrss()


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _proc_kib("/proc/self/status", "VmHWM:") or _maxrss()


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rng_state(device):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device)
                                   if device.type == "cuda" else None)


def _set_rng_state(device, state) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


# ------------------------------------------------------------------ micro_batch_size: auto


@dataclass
class SplitChoice:
    micro_batch_size: int
    accumulation_steps: int
    budget: int
    table: list[ProbeRow]

    @property
    def peak_bytes(self) -> int:
        return next(r.peak_bytes for r in self.table
                    if r.micro_batch_size == self.micro_batch_size)


def resolve_auto_split(config, n_features: int, train_windows, precision):
    """`micro_batch_size: auto` -> (config with integer micro and K, SplitChoice); a config
    with integers comes back as it is, with None. ConfigError when nothing fits the budget."""
    if config.micro_batch_size != "auto":
        return config, None
    from rul.models import build_model
    from rul.training.batching import WindowBatches
    from rul.training.optim import make_optimizer

    b = config.effective_batch_size
    sizes = [s for s in candidates(b) if s <= len(train_windows.starts)] or [
        len(train_windows.starts)]
    batches = WindowBatches(train_windows, precision.device)
    sample = batches.get(torch.arange(max(sizes), device=precision.device))
    budget = config.memory_budget or default_budget(precision.device)
    table = probe(lambda: build_model(config, n_features).to(precision.device), sample,
                  precision, sizes, lambda m: make_optimizer(m, config), config.max_grad_norm,
                  config.rul_cap, stop_above=budget)
    try:
        micro, k = choose_split(b, budget, table)
    except MemoryBudgetError as error:
        from rul.config import ConfigError  # pydantic: not needed by the bench

        raise ConfigError(str(error)) from None
    resolved = config.replace(micro_batch_size=micro, accumulation_steps=k,
                              effective_batch_size=b)
    return resolved, SplitChoice(micro, k, budget, table)

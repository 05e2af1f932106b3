"""`micro_batch_size: auto`: the measured peak memory of one training step per micro-batch
size, and the split of the effective batch it allows.

With exact accumulation the model depends only on the effective batch B, the micro-batch size
only memory and speed. `probe` measures each candidate's peak over one real `optimizer_step` at
the run's precision on a fresh model and optimizer (rul.training.peak_memory); `choose_split`
picks the largest that fits the budget and K = ceil(B / micro), the last micro-batch maybe
short (docs: Performance, Memory).
"""

import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from rul.errors import ConfigError
from rul.training.peak_memory import available_bytes, peak_bytes, reset_peak
from rul.training.seeding import RandomState
from rul.training.step import StepSettings, optimizer_step

MIN_CANDIDATE = 8
CUDA_MARGIN = 0.10  # default CUDA budget: free memory less 10% (allocator fragmentation)
CPU_SHARE = 0.5  # default CPU budget: half of the memory available when the probe starts


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


def probe(model_factory, sample_batch, settings: StepSettings, candidate_sizes,
          optimizer_factory=None, stop_above: int | None = None) -> list[ProbeRow]:
    """Peak memory and time of one optimizer step per micro size, smallest first:
    `model_factory()` builds a fresh model on the training device, `sample_batch` (x, y) holds
    at least max(candidate_sizes) samples, `optimizer_factory(model)` defaults to AdamW. A
    candidate out of memory has peak_bytes = -1; with `stop_above` (a budget) the larger ones
    are skipped once one exceeds it."""
    make_optimizer = optimizer_factory or (lambda m: torch.optim.AdamW(m.parameters()))
    x, y = sample_batch
    random_state = RandomState(x.device)  # the probe must not move the run's random streams
    try:
        first = min(candidate_sizes)  # warm-up: one-time lazy initialisation is not a cost
        _measure(model_factory, make_optimizer, settings, x[:first], y[..., :first])
        rows = []
        for size in sorted(candidate_sizes):
            try:
                peak, seconds = _measure(model_factory, make_optimizer, settings, x[:size],
                                         y[..., :size])
            except torch.OutOfMemoryError:
                peak, seconds = -1, math.inf
            rows.append(ProbeRow(size, peak, seconds))
            if stop_above is not None and not 0 <= peak <= stop_above:
                break
        return rows
    finally:
        random_state.restore()


def choose_split(effective_batch_size: int, budget: int, table: list[ProbeRow]
                 ) -> tuple[int, int]:
    """(micro, K): the largest measured micro size whose peak fits `budget`, K = ceil(B/micro);
    ConfigError naming the budget when none fits."""
    fits = [row for row in table if 0 <= row.peak_bytes <= budget
            and row.micro_batch_size <= effective_batch_size]
    if not fits:
        measured = [row for row in table if row.peak_bytes >= 0]
        smallest = min(measured, key=lambda row: row.peak_bytes) if measured else None
        detail = (f"the smallest measured peak is {format_bytes(smallest.peak_bytes)} at "
                  f"micro_batch_size={smallest.micro_batch_size}" if smallest
                  else "every candidate ran out of memory")
        raise ConfigError(f"memory_budget={format_bytes(budget)}: below every candidate "
                          f"micro-batch size ({detail})")
    micro = max(row.micro_batch_size for row in fits)
    return micro, math.ceil(effective_batch_size / micro)


def default_budget(device: torch.device) -> int:
    """CUDA: free device memory less CUDA_MARGIN; CPU: CPU_SHARE of MemAvailable (Linux) or
    of physical memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * (1 - CUDA_MARGIN))
    available = available_bytes()
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


def _measure(model_factory, make_optimizer, settings: StepSettings, x, y):
    baseline = reset_peak(x.device)
    model = model_factory()
    model.train()
    return measure_step(model, make_optimizer(model), settings.precision.grad_scaler(),
                        [(x, y)], settings, baseline)


def measure_step(model, optimizer, scaler, micro_batches, settings: StepSettings,
                 baseline: int | None = None) -> tuple[int, float]:
    """(peak bytes, seconds) of one optimizer_step over `micro_batches`; `baseline` is the
    memory reading peaks count from (default: a fresh reset now)."""
    device = settings.precision.device
    if baseline is None:
        baseline = reset_peak(device)
    started = time.perf_counter()
    optimizer_step(model, optimizer, scaler, micro_batches, settings)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return peak_bytes(device) - baseline, seconds


@dataclass
class SplitChoice:
    """What the probe measured and chose for `micro_batch_size: auto`."""

    micro_batch_size: int
    accumulation_steps: int
    budget: int
    table: list[ProbeRow]

    @property
    def peak_bytes(self) -> int:
        return next(r.peak_bytes for r in self.table
                    if r.micro_batch_size == self.micro_batch_size)


def probe_split(loop, network, optimization, settings: StepSettings,
                train_windows) -> SplitChoice:
    """Measure the candidate micro sizes for `network` (a NetworkSpec) with `optimization`
    (OptimizerSettings) and `settings` on `train_windows`, and choose within `loop`'s memory
    budget (or the default); ConfigError when nothing fits."""
    from rul.training.batching import WindowBatches
    from rul.training.optim import make_optimizer

    b, device = loop.effective_batch_size, settings.precision.device
    sizes = [s for s in candidates(b) if s <= len(train_windows.starts)] or [
        len(train_windows.starts)]
    sample = WindowBatches(train_windows, device).get(torch.arange(max(sizes), device=device))
    budget = loop.memory_budget or default_budget(device)
    table = probe(lambda: network.build().to(device), sample, settings, sizes,
                  lambda m: make_optimizer(m, optimization), stop_above=budget)
    micro, k = choose_split(b, budget, table)
    return SplitChoice(micro, k, budget, table)

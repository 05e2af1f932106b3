"""`precision: auto` on a CPU with native bf16 (AVX512-BF16 or AMX) by measurement: the
default step (`make train`'s DCNN, effective batch 512 = 256 x 2, AdamW, clipping) timed in
fp32 and in bf16 autocast, in interleaved rounds of about a second, on first use per machine.

The flag alone says nothing about speed: on a 2-core Intel Xeon with AVX512-BF16 and no AMX,
bf16 autocast ran the default step at 0.86x the reference where fp32's banded products ran
it at 1.20x (issue 51); on the AMD EPYC of the Performance page bf16 was the faster.

The figures are kept in a user cache file (RUL_PRECISION_CACHE, else precision.json in
rul.files.cache_folder(), ~/.cache/rul/ by default) under the CPU's model name and torch's
version, so a machine measures once; delete the file to measure again. The probe leaves
torch's random state as it found it (a run's seeds decide its numbers alone).
"""

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rul.files import cache_folder, keep_in_cache

B = 512  # the default effective batch, in two micro-batches of 256
ROUNDS = 3  # interleaved: fp32, bf16, fp32, bf16, ...; the median of each
ROUND_S = 0.5  # seconds of steps per precision and round (at least one step)
BUDGET_S = 6.0  # no round starts after this (a slow machine: fewer rounds, never fewer than 1)
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Measured:
    """The default step's samples/s per precision on this machine, and where that was kept."""

    rates: dict  # precision name -> samples/s
    machine: str  # the cache's key: the CPU's model name and torch's version
    cache: Path
    fresh: bool  # measured now (False: read from the cache)

    @property
    def faster(self) -> str:
        return max(PRECISIONS, key=lambda name: self.rates[name])

    def figures(self) -> str:
        """`bf16 6,656 samples/s, fp32 9,301`: the precisions' figures, the faster first."""
        ordered = sorted(PRECISIONS, key=lambda name: -self.rates[name])
        return ", ".join(f"{name} {self.rates[name]:,.0f}" + (" samples/s" if i == 0 else "")
                         for i, name in enumerate(ordered))


def cache_path() -> Path:
    if os.environ.get("RUL_PRECISION_CACHE"):
        return Path(os.environ["RUL_PRECISION_CACHE"])
    return cache_folder() / "precision.json"


def machine_key() -> str:
    from rul.training.hardware import cpuinfo_field

    return f"{cpuinfo_field('model name') or 'unknown CPU'}, torch {torch.__version__}"


def measured(measure=None) -> Measured:
    """This machine's figures: from the cache, else measured now (`measure`: the function
    that times the step, `measure_step` unless a test gives another) and kept."""
    path, key = cache_path(), machine_key()
    kept = _read(path)
    if key in kept and all(name in kept[key] for name in PRECISIONS):
        return Measured({n: float(kept[key][n]) for n in PRECISIONS}, key, path, fresh=False)
    rates = (measure or measure_step)()
    kept[key] = {**rates, "measured": time.strftime("%Y-%m-%d")}
    keep_in_cache(path, json.dumps(kept, indent=1).encode())  # not kept: measured again next time
    return Measured(rates, key, path, fresh=True)


def _read(path: Path) -> dict:
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def measure_step(rounds: int = ROUNDS, seconds: float = ROUND_S, budget: float = BUDGET_S,
                 batch: int = B) -> dict[str, float]:
    """samples/s of the default step per precision, the median of up to `rounds` interleaved
    rounds of about `seconds` each (none started after `budget` seconds), after a warm-up
    step (`batch` samples in two micro-batches: the default's 512 unless a test asks for
    less); torch's random state is restored."""
    from rul.models.spec import NetworkSpec
    from rul.training.precision import Precision
    from rul.training.step import StepSettings, optimizer_step

    spec, cpu = NetworkSpec(), torch.device("cpu")
    steps, began = {}, time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        x = torch.randn(batch, spec.window, spec.n_features)
        y = torch.rand(batch) * spec.rul_cap
        batches = list(zip(x.split(batch // 2), y.split(batch // 2), strict=True))
        for name in PRECISIONS:
            model = spec.build()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            precision = Precision(cpu, name, use_scaler=False, reason="probe")
            settings, scaler = StepSettings(precision, 1.0, spec.rul_cap), precision.grad_scaler()
            steps[name] = (lambda m=model, o=optimizer, s=scaler, t=settings:
                           optimizer_step(m, o, s, batches, t))
            steps[name]()  # warm-up: one-time costs are not in samples/s
        rates = {name: [] for name in PRECISIONS}
        for round_ in range(rounds):
            if round_ and time.perf_counter() - began > budget:
                break
            for name, step in steps.items():
                started, done = time.perf_counter(), 0
                while done == 0 or time.perf_counter() - started < seconds:
                    step()
                    done += 1
                rates[name].append(batch * done / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}

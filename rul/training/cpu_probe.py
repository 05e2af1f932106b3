"""`precision: auto` on a CPU with native bf16 (AVX512-BF16 or AMX) by measurement: a recipe's
step (rul.plan passes `make train`'s) timed in fp32 and in bf16 autocast, in interleaved rounds
of about half a second, on first use per machine and recipe. The flag alone does not say which
is faster (docs: Performance, precision by machine).

The figures are kept in a user cache file (RUL_PRECISION_CACHE, else precision.json in
rul.files.cache_folder(), private to the user) under what decides them: the CPU's model, its
bf16 and AMX flags, the cores this process may use, torch's build and the recipe's step. The
machine's load when they were taken is kept with them: a figure taken busier than the machine
has cores is taken again next time; a file or an entry that is not figures of rul's is
measured again, with one warning line. The probe leaves torch's random state as it found it.
"""

import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rul.files import CacheFile, cache_file
from rul.training import hardware
from rul.training.optim import make_optimizer
from rul.training.precision import Precision
from rul.training.settings import StepRecipe
from rul.training.step import optimizer_step

ROUNDS = 3  # interleaved: fp32, bf16, fp32, bf16, ...; the median of each
ROUND_S = 0.5  # seconds of steps per precision and round (at least one step)
BUDGET_S = 6.0  # no round starts after this (a slow machine: fewer rounds, never fewer than 1)
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Measured:
    """A recipe's step in samples/s per precision on this machine, and where that was kept."""

    rates: dict  # precision name -> samples/s
    machine: str  # the machine part of the cache's key
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


def cache_entry() -> CacheFile:
    if os.environ.get("RUL_PRECISION_CACHE"):
        path = Path(os.environ["RUL_PRECISION_CACHE"])
        return CacheFile(path.parent, path.name, own_root=False)  # its folder stays as it is
    return cache_file("precision.json")


def machine_key() -> str:
    """What decides the answer on this machine: the CPU's model, its bf16/AMX flags, the
    cores this process may use and torch's build (one model name covers CPUs with AMX and
    without)."""
    flags = " ".join(f for f in hardware.cpu_flags() if "bf16" in f or "amx" in f)
    return (f"{hardware.cpu_model()}, {flags or 'no bf16 flags'}, {hardware.usable_cpus()} "
            f"cores, torch {torch.__version__}")


def cache_key(step: StepRecipe) -> str:
    return f"{machine_key()}; step {step.key()}"


def measured(step: StepRecipe, measure=None) -> Measured:
    """This machine's figures for `step`: from the cache when they were taken on a machine no
    busier than its cores, else measured now (`measure(step)`: measure_step unless a test
    gives another) and kept with the load they were taken at."""
    cache, key = cache_entry(), cache_key(step)
    kept = _read(cache)
    entry = _figures(kept.get(key)) if key in kept else None
    if key in kept and entry is None:
        cache.doubt("its entry for this machine is not figures of rul's",
                    "measured again")
    if entry is not None and entry["load"] <= entry["cores"]:
        return Measured({n: entry[n] for n in PRECISIONS}, machine_key(), cache.path,
                        fresh=False)
    load = _load()
    rates = (measure or measure_step)(step)
    kept[key] = {**rates, "load": load, "cores": hardware.usable_cpus(),
                 "measured": time.strftime("%Y-%m-%d")}
    cache.keep(json.dumps(kept, indent=1).encode())  # not kept: measured again next time
    return Measured(rates, machine_key(), cache.path, fresh=True)


def _figures(entry) -> dict | None:
    """A kept entry's figures and load as floats: positive finite rates, a finite load and
    cores; None when it is anything else."""
    if not isinstance(entry, dict):
        return None
    try:
        numbers = {name: float(entry[name]) for name in (*PRECISIONS, "load", "cores")
                   if isinstance(entry[name], int | float) and not isinstance(entry[name], bool)}
    except (KeyError, OverflowError):
        return None
    if len(numbers) != len(PRECISIONS) + 2 or not all(map(math.isfinite, numbers.values())):
        return None
    return numbers if all(numbers[name] > 0 for name in PRECISIONS) else None


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available here: count the machine as quiet
        return 0.0


def _read(cache: CacheFile) -> dict:
    """The kept figures by key; {} when none are kept, or the file is not rul's (said)."""
    data = cache.read()
    if data is None:
        return {}
    try:
        kept = json.loads(data)
    except (ValueError, RecursionError):  # not JSON (or nested past Python's recursion limit)
        kept = None
    if not isinstance(kept, dict):
        cache.doubt("not a JSON object of figures", "measured again")
        return {}
    return kept


def measure_step(step: StepRecipe, rounds: int = ROUNDS, seconds: float = ROUND_S,
                 budget: float = BUDGET_S, batch: int | None = None) -> dict[str, float]:
    """samples/s of `step` per precision on the CPU, the median of up to `rounds` interleaved
    rounds of about `seconds` each (none started after `budget` seconds), after a warm-up
    step (`batch`: fewer samples than its effective batch, split alike, for a test); torch's
    random state is restored."""
    cpu, steps, began = torch.device("cpu"), {}, time.perf_counter()
    micro_batches = step.micro_batches(cpu, batch)
    samples = sum(y.shape[-1] for _, y in micro_batches)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name in PRECISIONS:
            model = step.network.build()
            precision = Precision(cpu, name, use_scaler=False, reason="probe")
            optimizer = make_optimizer(model, step.optimizer(precision), sync_free=False)
            settings = step.settings(precision)
            scaler = settings.precision.grad_scaler()
            steps[name] = (lambda m=model, o=optimizer, s=scaler, t=settings:
                           optimizer_step(m, o, s, micro_batches, t))
            steps[name]()  # warm-up: one-time costs are not in samples/s
        rates = {name: [] for name in PRECISIONS}
        for round_ in range(rounds):
            if round_ and time.perf_counter() - began > budget:
                break
            for name, run in steps.items():
                started, done = time.perf_counter(), 0
                while done == 0 or time.perf_counter() - started < seconds:
                    run()
                    done += 1
                rates[name].append(samples * done / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}

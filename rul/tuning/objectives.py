"""What a study optimises: the tuning config's `objectives`, their directions, and each
trial's values, read from the metrics its training run measured and logged per epoch.

- val_rmse: the best validation RMSE (the early-stopping criterion; the model that is kept).
- samples_per_s: the median over epochs of the training throughput (the first epoch's
  warm-up does not decide it).
- peak_memory_mb: the largest per-epoch peak memory (CUDA: peak allocated by torch; CPU: the
  process's peak resident set). Reset before each trial when it is an objective, so a trial is
  not charged for the one before it in the same worker.

One objective (the default, [val_rmse]) is an ordinary single-objective study with pruning.
Several make a multi-objective study (Optuna `directions`): Optuna cannot prune those (no
`trial.report`), so pruning is off whatever `pruner` says. Imports nothing heavy: the config
module reads the names from here.
"""

import contextlib
import statistics

OBJECTIVES = {"val_rmse": "minimize", "samples_per_s": "maximize", "peak_memory_mb": "minimize"}
DEFAULT = ("val_rmse",)
ACCURACY = "val_rmse"  # must be listed: it picks the trial that is registered


def check_objectives(names: list[str]) -> list[str]:
    """The names unchanged, or ValueError saying what is wrong with the list."""
    if not names:
        raise ValueError("must list at least one objective (" + ", ".join(OBJECTIVES) + ")")
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise ValueError(f"unknown objective {unknown[0]!r}{_hint(unknown[0])}; known: "
                         + ", ".join(OBJECTIVES))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"lists {repeated[0]!r} twice")
    if ACCURACY not in names:
        raise ValueError(f"must include {ACCURACY} (the registered model is the trial with "
                         "the best val_rmse)")
    return names


def _hint(name: str) -> str:
    import difflib

    aliases = {"samples_per_second": "samples_per_s", "throughput": "samples_per_s",
               "peak_memory": "peak_memory_mb", "memory": "peak_memory_mb", "rmse": "val_rmse"}
    close = difflib.get_close_matches(name, [*OBJECTIVES, *aliases], n=1)
    return f" (did you mean {aliases.get(close[0], close[0])!r}?)" if close else ""


def directions(names) -> list[str]:
    return [OBJECTIVES[n] for n in names]


def is_multi(names) -> bool:
    return len(names) > 1


def trial_values(names, state) -> list[float]:
    """The objectives of a finished training (`TrainState`), in the order of `names`."""
    history = state.history
    measured = {
        "val_rmse": state.best_val_rmse,
        "samples_per_s": statistics.median(h["samples_per_s"] for h in history),
        "peak_memory_mb": max(h["peak_memory_mb"] for h in history),
    }
    return [float(measured[n]) for n in names]


def accuracy_of(trial, names) -> float:
    """A completed trial's val_rmse, whatever the number of objectives."""
    return trial.values[list(names).index(ACCURACY)]


def best_accuracy_trial(study, names):
    """The trial registered as the study's best: single objective, Optuna's best trial;
    several, the trial of the Pareto front with the lowest val_rmse (the lower number on a
    tie)."""
    if not is_multi(names):
        return study.best_trial
    return min(study.best_trials, key=lambda t: (accuracy_of(t, names), t.number))


def reset_peak_memory() -> None:
    """Start a fresh peak: CUDA's peak-allocated counter and (Linux) the process's VmHWM,
    which ru_maxrss reads."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")

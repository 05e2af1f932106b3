"""What a study optimises: the tuning config's `objectives`, their directions, and each
trial's values, read from the metrics its training run measured and logged per epoch.

- val_rmse: the best validation RMSE (the early-stopping criterion; the model that is kept).
- samples_per_s: the median over epochs of the training throughput (the first epoch's
  warm-up does not decide it).
- peak_memory_mb: the largest per-epoch peak memory (CUDA: peak allocated by torch; CPU: the
  process's peak resident set). Reset before each trial (and each of its seeds) when it is an
  objective, so a run is not charged for the one before it in the same worker.

One objective (the default, [val_rmse]) is an ordinary single-objective study with pruning.
Several make a multi-objective study (Optuna `directions`): Optuna cannot prune those (no
`trial.report`), so pruning is off whatever `pruner` says. The names and their directions are
configuration (rul.config.OBJECTIVES, checked when the tuning config loads). A trial trained
on several seeds (`seeds_per_trial`) is valued at the mean of its seeds' val_rmse and
samples_per_s, and at the largest of their peak_memory_mb.
"""

import statistics

from rul.config import ACCURACY, OBJECTIVES
from rul.config import DEFAULT_OBJECTIVES as DEFAULT  # noqa: F401 (the study reads it here)
from rul.training.peak_memory import reset_peak


def directions(names) -> list[str]:
    return [OBJECTIVES[n] for n in names]


def is_multi(names) -> bool:
    return len(names) > 1


def trial_values(names, state) -> list[float]:
    """The objectives of a finished training (`TrainState`), in the order of `names`."""
    history = state.history
    measured = {
        "val_rmse": lambda: state.best_val_rmse,
        "samples_per_s": lambda: statistics.median(h["samples_per_s"] for h in history),
        "peak_memory_mb": lambda: max(h["peak_memory_mb"] for h in history),
    }
    return [float(measured[n]()) for n in names]


# How a trial of several seeds is valued on each objective: the mean, but for the memory a
# config needs, the largest of its seeds' peaks.
OVER_SEEDS = {"val_rmse": statistics.fmean, "samples_per_s": statistics.fmean,
              "peak_memory_mb": max}


def over_seeds(names, states) -> list[float]:
    """A trial's objectives over the seeds it trained (`seeds_per_trial`), in the order of
    `names`: each objective's OVER_SEEDS of its seeds' values (one seed: its own values)."""
    per_seed = [trial_values(names, state) for state in states]
    return [float(OVER_SEEDS[n](column))
            for n, column in zip(names, zip(*per_seed, strict=True), strict=True)]


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
    """Start a fresh peak, so that a trial is not charged for the one before it."""
    import torch

    reset_peak(torch.device("cuda" if torch.cuda.is_available() else "cpu"))

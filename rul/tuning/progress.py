"""What `rul tune` says while it works: a line when a trial starts (its number, its place
towards the target, the values drawn), a line when it ends (its state, the epochs it trained,
its best validation RMSE, its time, why it was pruned) and, once a trial has ended, an
estimate of the study's time in all and left.

The estimate is the mean time of the study's ended trials (complete, pruned or failed, this
invocation's and an earlier one's) times the trials left, shared by the workers. Lines go to
stderr: stdout keeps the study's summary.
"""

import sys
import time

import optuna

from rul.console import duration
from rul.training.listener import TrainingListener

ENDED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
         optuna.trial.TrialState.FAIL)


class TrialWatch(TrainingListener):
    """A trial's clock and what its epochs said: the count and the best validation RMSE."""

    def __init__(self):
        self.started = time.monotonic()
        self.epochs = 0
        self.best_val_rmse: float | None = None

    def on_epoch(self, epoch, step, metrics) -> None:
        self.epochs = epoch
        rmse = metrics["val_rmse"]
        self.best_val_rmse = rmse if self.best_val_rmse is None else min(self.best_val_rmse,
                                                                          rmse)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


def _values(params: dict) -> str:
    return " ".join(f"{name}={value:.3g}" if isinstance(value, float) else f"{name}={value}"
                    for name, value in params.items())


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def started_line(trial: optuna.Trial, counted: int, target: int | None) -> str:
    """`trial 3 (4 of 20): lr=0.0012 filters=32`: `counted` trials so far, this one too."""
    place = f" ({counted} of {target})" if target else ""
    return f"trial {trial.number}{place}: {_values(trial.params)}"


def ended_line(number: int, state: str, watch: TrialWatch, reason: str = "") -> str:
    """`trial 3: complete, 12 epochs, best val RMSE 14.21, 183 s` (the reason after a state
    other than complete)."""
    rmse = "" if watch.best_val_rmse is None else f", best val RMSE {watch.best_val_rmse:.2f}"
    why = f" ({reason})" if reason and state != "complete" else ""
    epochs = f"{watch.epochs} epoch" + ("" if watch.epochs == 1 else "s")
    return (f"trial {number}: {state}{why}, {epochs}{rmse}, "
            f"{watch.seconds:.0f} s")


def estimate_line(study: optuna.Study, target: int | None, workers: int) -> str | None:
    """`study s: 4 of 20 trials ended, 2.3 min each: about 46 min in all, 37 min left`, from
    the study's ended trials; None before one has ended or without a target."""
    ended = [t for t in study.get_trials(deepcopy=False, states=ENDED)
             if t.datetime_start and t.datetime_complete]
    if not ended or not target:
        return None
    each = sum((t.datetime_complete - t.datetime_start).total_seconds()
               for t in ended) / len(ended)
    left = max(target - len(ended), 0)
    return (f"study {study.study_name}: {len(ended)} of {target} trials ended, "
            f"{duration(each)} each: about {duration(each * target / workers)} in all, "
            f"{duration(each * left / workers)} left")

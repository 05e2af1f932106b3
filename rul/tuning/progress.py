"""What `rul tune` says while it works: a line when a trial starts (its number, its place
towards the target, the values drawn), a line per epoch (its validation RMSE, the trial's time
in all and left and, until a trial has ended, the study's), a line when it ends (its state,
the epochs it trained, its best validation RMSE, its time, why it was pruned) and, once a
trial has ended, an estimate of the study's time in all and left.

An epoch's estimate is the trial's epochs so far at their mean time (its data prepared
included) over its most epochs (every seed's; early stopping or the pruner may end it sooner);
the study's, before a trial has ended, that times the trials to reach, shared by the workers.
After that, the estimate is the mean time of the study's ended trials (complete, pruned or
failed, this invocation's and an earlier one's) times the trials left, shared by the workers.
Lines go to stderr: stdout keeps the study's summary.
"""

import sys
import time
from dataclasses import dataclass

import optuna

from rul.console import duration
from rul.tracking.study_runs import BASELINE_ATTR
from rul.training.listener import TrainingListener

ENDED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
         optuna.trial.TrialState.FAIL)


class TrialWatch(TrainingListener):
    """A trial's clock and what its epochs said, seed by seed (`seeds_per_trial`): the epochs
    each trained and its best validation RMSE."""

    def __init__(self):
        self.started = time.monotonic()
        self.seeds: list[dict] = []  # per seed: {"epochs": n, "best": rmse or None}
        self.said: Plan | None = None  # with a plan, a line per epoch

    def say_epochs(self, number: int, epochs: int, seeds: int = 1,
                   study_trials: float | None = None) -> None:
        """From here on a line per epoch of trial `number` (`epochs` per seed, `seeds` of
        them); `study_trials`: the trials to reach per worker, given while none has ended,
        adds the study's estimate."""
        self.said = Plan(number, epochs, seeds, study_trials)

    def start_seed(self) -> None:
        self.seeds.append({"epochs": 0, "best": None})

    def on_epoch(self, epoch, step, metrics) -> None:
        if not self.seeds:
            self.start_seed()
        seed, rmse = self.seeds[-1], metrics["val_rmse"]
        seed["epochs"] = epoch
        seed["best"] = rmse if seed["best"] is None else min(seed["best"], rmse)
        if self.said is not None:
            say(epoch_line(self, rmse))

    @property
    def epochs(self) -> int:
        return self.seeds[-1]["epochs"] if self.seeds else 0

    @property
    def best_val_rmse(self) -> float | None:
        """One seed: its best; several: the mean of their bests (the trial's value)."""
        bests = [seed["best"] for seed in self.seeds]
        if not bests or None in bests:
            return None
        return sum(bests) / len(bests)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Plan:
    """What a trial's epoch lines say it is up to."""

    number: int
    epochs: int  # per seed
    seeds: int
    study_trials: float | None  # trials per worker to reach, while no trial has ended


def epoch_line(watch: TrialWatch, rmse: float) -> str:
    """`trial 0, epoch 3 of 30: val RMSE 21.46 (best 20.10); about 6.0 min for the trial
    (5.4 min left), the study about 48 min`: a seed's place first when there are several
    (`trial 0, seed 2 of 3, epoch 3 of 30: ...`); the study's estimate until a trial ended."""
    plan, seed = watch.said, watch.seeds[-1]
    place = f", seed {len(watch.seeds)} of {plan.seeds}" if plan.seeds > 1 else ""
    done = sum(s["epochs"] for s in watch.seeds)
    total = done - seed["epochs"] + plan.epochs * (plan.seeds - len(watch.seeds) + 1)
    each = watch.seconds / max(done, 1)
    line = (f"trial {plan.number}{place}, epoch {seed['epochs']} of {plan.epochs}: val RMSE "
            f"{rmse:.2f} (best {seed['best']:.2f}); about {duration(each * total)} for the "
            f"trial ({duration(each * max(total - done, 0))} left)")
    if plan.study_trials:
        line += f", the study about {duration(each * total * plan.study_trials)}"
    return line


def _values(params: dict) -> str:
    return " ".join(f"{name}={value:.3g}" if isinstance(value, float) else f"{name}={value}"
                    for name, value in params.items())


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def started_line(trial: optuna.Trial, counted: int, target: int | None) -> str:
    """`trial 3 (4 of 20): lr=0.0012 filters=32`: `counted` trials so far, this one too; the
    baseline trial's values are said to be the base config's."""
    place = f" ({counted} of {target})" if target else ""
    base = " (the base config's)" if trial.user_attrs.get(BASELINE_ATTR) else ""
    return f"trial {trial.number}{place}: {_values(trial.params)}{base}"


def ended_line(number: int, state: str, watch: TrialWatch, reason: str = "") -> str:
    """`trial 3: complete, 12 epochs, best val RMSE 14.21, 183 s` (the reason after a state
    other than complete); a trial of several seeds, `trial 3: complete, 3 seeds of 50 / 50 /
    48 epochs, val RMSE 11.02 (best of each: 10.83 / 12.16 / 10.07), 1412 s`: their mean."""
    why = f" ({reason})" if reason and state != "complete" else ""
    if len(watch.seeds) > 1:
        epochs = " / ".join(str(seed["epochs"]) for seed in watch.seeds)
        bests = " / ".join("-" if seed["best"] is None else f"{seed['best']:.2f}"
                           for seed in watch.seeds)
        rmse = "" if watch.best_val_rmse is None else f", val RMSE {watch.best_val_rmse:.2f}"
        return (f"trial {number}: {state}{why}, {len(watch.seeds)} seeds of {epochs} epochs"
                f"{rmse} (best of each: {bests}), {watch.seconds:.0f} s")
    rmse = "" if watch.best_val_rmse is None else f", best val RMSE {watch.best_val_rmse:.2f}"
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

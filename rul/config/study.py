"""The study's own keys (`rul tune`'s, beside the training keys): the search space and its
dimensions, the objectives, the pruner, the storage's heartbeats. rul.config.tuning adds the
base training config and the rules that relate the two."""

import difflib
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rul.config.values import (
    Flag,
    NonNegativeInt,
    OptionalText,
    PositiveInt,
    _number,
    _one_of,
    _Strict,
    rule_error,
)

# What a study can optimise and in which direction (rul.tuning.objectives measures them).
OBJECTIVES = {"val_rmse": "minimize", "samples_per_s": "maximize", "peak_memory_mb": "minimize"}
DEFAULT_OBJECTIVES = ("val_rmse",)
ACCURACY = "val_rmse"  # must be listed: it picks the trial that is registered


def check_objectives(names: list[str]) -> list[str]:
    """The names unchanged, or ValueError saying what is wrong with the list."""
    if not names:
        raise ValueError("must list at least one objective (" + ", ".join(OBJECTIVES) + ")")
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise ValueError(f"unknown objective {unknown[0]!r}{_objective_hint(unknown[0])}; "
                         "known: " + ", ".join(OBJECTIVES))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"lists {repeated[0]!r} twice")
    if ACCURACY not in names:
        raise ValueError(f"must include {ACCURACY} (the registered model is the trial with "
                         "the best val_rmse)")
    return names


def _objective_hint(name: str) -> str:
    aliases = {"samples_per_second": "samples_per_s", "throughput": "samples_per_s",
               "peak_memory": "peak_memory_mb", "memory": "peak_memory_mb", "rmse": "val_rmse"}
    close = difflib.get_close_matches(name, [*OBJECTIVES, *aliases], n=1)
    return f" (did you mean {aliases.get(close[0], close[0])!r}?)" if close else ""


class Categorical(_Strict):
    type: Literal["categorical"]
    """categorical: draw one of `choices`."""
    choices: Annotated[list[bool | int | float | str | None], Field(
        min_length=1, description="a non-empty list of values")]
    """The values a trial may draw."""


class _Range(_Strict):
    @model_validator(mode="after")
    def _ordered_bounds(self):
        if not self.low < self.high:
            raise rule_error(f"low={self.low!r}", f"must be less than high={self.high!r}")
        if self.log and self.low <= 0:
            raise rule_error(f"low={self.low!r}", "must be > 0 with log: true")
        return self


class IntRange(_Range):
    type: Literal["int"]
    """int: draw an integer between low and high (both included)."""
    low: Annotated[int, Field(description="an integer")]
    """Smallest value."""
    high: Annotated[int, Field(description="an integer")]
    """Largest value."""
    log: Flag = False
    """Draw on a log scale (low must be > 0)."""


class FloatRange(_Range):
    type: Literal["float"]
    """float: draw a number between low and high."""
    low: _number("a number")
    """Smallest value."""
    high: _number("a number")
    """Largest value."""
    log: Flag = False
    """Draw on a log scale (low must be > 0)."""


Dimension = Annotated[Categorical | IntRange | FloatRange, Field(discriminator="type")]


class StudyKeys(_Strict):
    """The keys `rul tune` reads besides the training keys."""

    search_space: Annotated[dict[str, Dimension], Field(
        description="a mapping of training keys to distributions")] = {}
    """Training keys each trial draws, each a distribution: categorical (choices), int or float
    (low, high, optional log)."""
    max_effective_batch: Annotated[PositiveInt | None, Field(
        description="a positive integer or null")] = None  # larger micro x K is pruned
    """Trials whose effective batch exceeds this are pruned before training; null: no limit."""
    scale_lr_with_batch: Flag = False  # lr x effective_batch / 512 (linear scaling rule)
    """Scale each trial's lr by effective_batch_size / 512 (the linear scaling rule)."""
    n_trials: PositiveInt = 12
    """Trials to run when the command gives no --n-trials."""
    seeds_per_trial: PositiveInt = 1
    """Validation splits each trial is scored on: it trains once per seed (seed, seed + 1, ...,
    the seeds of `rul evaluate --seeds`: each its own split, weight init and batch order), and
    its objective is their mean. More than one lets a study tell apart what a single split's
    noise hides, at that many times a trial's cost; the pruner judges the first seed only."""
    baseline_trial: Flag = False
    """Start the study with a trial of the base config's own values of the searched keys (the
    recipe in place), so it is scored on the same splits, and judged by the same pruner, as
    the values drawn. Each base value must be one the space can draw. A resumed study trains
    it again only if it was interrupted or killed."""
    promote: Flag = False
    """Offer the best trial's registered version the champion alias (it moves only when that
    version wins on the same evidence: docs: Predict and serve, Promotion); by default the
    study registers it and leaves the alias where it is."""
    pruner: _one_of("median", "hyperband", "none") = "median"
    """Pruner that stops unpromising trials on their per-epoch validation RMSE (off for several
    objectives)."""
    pruner_warmup_epochs: NonNegativeInt = 3
    """Epochs a trial trains before it may be pruned."""
    study_name: OptionalText = None  # default rul-<subset>-tune
    """Optuna study name; null: rul-<subset>-tune."""
    # Study on a database server (--storage postgresql://...): a worker beats every
    # heartbeat_interval seconds; one silent for the grace period (default 2 intervals) is
    # dead, its trial FAIL (and retried up to retry_dead_trials times).
    heartbeat_interval: PositiveInt = 60
    """Seconds between a worker's heartbeats on a database storage (PostgreSQL)."""
    heartbeat_grace_period: Annotated[PositiveInt | None, Field(
        description="a positive integer or null")] = None
    """Seconds of silence after which a worker counts as dead and its trial fails; null: two
    heartbeat intervals."""
    retry_dead_trials: NonNegativeInt = 0
    """How many times a trial whose worker died is re-queued."""
    # What the study optimises (rul.tuning.objectives): val_rmse alone, or with samples_per_s
    # and/or peak_memory_mb (multi-objective: a Pareto front, no pruning).
    objectives: Annotated[list[str], Field(description=(
        "a non-empty list of objective names: val_rmse, samples_per_s, peak_memory_mb"))] = list(
        DEFAULT_OBJECTIVES)
    """What the study optimises: val_rmse alone, or with samples_per_s and/or peak_memory_mb (a
    Pareto front)."""

    @field_validator("objectives")
    @classmethod
    def _known_objectives(cls, value: list[str]) -> list[str]:
        return check_objectives(value)  # ValueError names the problem



# Keys read by `rul tune` only.
TUNING_KEYS = tuple(StudyKeys.model_fields)

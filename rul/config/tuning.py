"""TuningConfig, what `rul tune` reads: the base training config, the search space (its
dimensions, each checked against the training config), the objectives and the study's keys."""

import difflib
import warnings
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from rul.config.spelling import _did_you_mean
from rul.config.training import NOT_TUNABLE, TrainConfig, with_legacy_values
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

SPLIT_IN_SPACE = (
    "search_space lists {}: with exact accumulation micro_batch_size x accumulation_steps only "
    "splits the effective batch, which alone decides the model, so the sampler spends trials on "
    "splits of one batch and reads noise as signal. Search effective_batch_size instead: each "
    "trial then picks its micro-batch by measured memory (micro_batch_size: auto).")

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


class TuningConfig(_Strict):
    """What `rul tune` reads: the base training config (`train`) and the study's own keys.
    In YAML both sit side by side at the top level; `load_tuning` splits them."""

    train: TrainConfig = Field(default_factory=TrainConfig)
    """The base training config of every trial (in YAML its keys sit at the top level beside the
    tuning keys)."""
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

    @model_validator(mode="after")
    def _trials_are_single_models(self) -> "TuningConfig":
        if self.train.ensemble != 1:
            raise rule_error(f"ensemble={self.train.ensemble}", "a study's trials train single "
                             "models: tune with ensemble=1, then train the best as an ensemble")
        return self

    @model_validator(mode="after")
    def _space_fits_the_training_config(self) -> "TuningConfig":
        tunable = [k for k in TrainConfig.model_fields if k not in NOT_TUNABLE]
        for key, dimension in self.search_space.items():
            if key not in tunable:
                raise rule_error("search_space", f"{key!r} is not a tunable training key"
                                 + _did_you_mean(key, tunable))
            _check_dimension(self.train, key, dimension)
        split = [k for k in ("micro_batch_size", "accumulation_steps") if k in self.search_space]
        if split:
            warnings.warn(SPLIT_IN_SPACE.format(", ".join(split)), UserWarning, stacklevel=2)
        if "effective_batch_size" in self.search_space:
            smallest = self._smallest("effective_batch_size")
            if self.max_effective_batch and smallest > self.max_effective_batch:
                raise rule_error(f"max_effective_batch={self.max_effective_batch}",
                                 f"every trial would be pruned: the smallest effective_batch_size"
                                 f" is {smallest}")
            return self
        micro, k = self._smallest("micro_batch_size"), self._smallest("accumulation_steps")
        if self.max_effective_batch and micro * k > self.max_effective_batch:
            raise rule_error(f"max_effective_batch={self.max_effective_batch}",
                             f"every trial would be pruned: the smallest effective batch "
                             f"(micro_batch_size x accumulation_steps) is {micro}x{k}={micro * k}")
        return self

    @model_validator(mode="after")
    def _baseline_trains_the_base_config(self) -> "TuningConfig":
        """The baseline trial must train what `rul train` would: values the space can draw,
        an unscaled lr, an effective batch the study does not prune."""
        if not self.baseline_trial:
            return self
        if self.scale_lr_with_batch:
            raise rule_error("baseline_trial=true", "with scale_lr_with_batch the baseline would "
                             "train lr x effective_batch / 512, not the base config's lr: turn "
                             "one of them off")
        b = self.train.effective_batch_size
        if self.max_effective_batch and b > self.max_effective_batch:
            raise rule_error("baseline_trial=true", f"the base effective batch {b} is over "
                             f"max_effective_batch={self.max_effective_batch}: the baseline "
                             "would be pruned before training")
        for key, value in self.baseline_params().items():
            if problem := _undrawable(value, self.search_space[key]):
                raise rule_error(f"search_space.{key}", f"the base {key}={_yaml(value)} "
                                 f"{problem}, so baseline_trial cannot train it")
        return self

    def baseline_params(self) -> dict[str, Any]:
        """The base config's value of each searched key: the baseline trial's params."""
        return {key: getattr(self.train, key) for key in self.search_space}

    def _smallest(self, key: str) -> int:
        dimension = self.search_space.get(key)
        if dimension is None:
            return getattr(self.train, key)
        if isinstance(dimension, Categorical):
            return min(dimension.choices)  # checked above: positive integers
        return int(dimension.low)

    @property
    def effective_study_name(self) -> str:
        return self.study_name or f"rul-{self.train.dataset_name.lower()}-tune"

    def to_dict(self) -> dict[str, Any]:
        """The flat form of the YAML file: training keys and tuning keys side by side."""
        tuning = self.model_dump(exclude={"train", "search_space"})
        space = {k: d.model_dump(exclude_unset=True) for k, d in self.search_space.items()}
        return {**self.train.to_dict(), **tuning, "search_space": space}

    def replace(self, **changes) -> "TuningConfig":
        """A re-validated copy; `changes` may hold training and tuning keys."""
        from rul.config.loading import build_tuning  # loading imports this module

        return build_tuning(with_legacy_values(self.to_dict()), changes)


# Keys read by `rul tune` only (TuningConfig's own fields).
TUNING_KEYS = tuple(k for k in TuningConfig.model_fields if k != "train")


def _undrawable(value, dimension) -> str | None:
    """Why a dimension cannot draw `value` (None: it can)."""
    if isinstance(dimension, Categorical):
        if any(value == c and isinstance(value, bool) == isinstance(c, bool)
               for c in dimension.choices):  # true is not 1
            return None
        return "is not among its choices [" + ", ".join(_yaml(c) for c in dimension.choices) + "]"
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric and dimension.low <= value <= dimension.high and (
            isinstance(dimension, FloatRange) or float(value).is_integer()):
        return None
    kind = "an integer" if isinstance(dimension, IntRange) else "a number"
    return f"is not {kind} within low={dimension.low}..high={dimension.high}"


def _yaml(value) -> str:
    """A value as YAML writes it (null, true), for messages about config values."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _check_dimension(train: TrainConfig, key: str, dimension) -> None:
    """Each value a trial can draw must be valid for `key` on its own (cross-field rules such
    as transformer heads are left to the trial, which is pruned)."""
    if isinstance(dimension, Categorical):
        values = [("choice", v) for v in dimension.choices]
    else:
        cast = int if isinstance(dimension, IntRange) else float
        values = [("low", cast(dimension.low)), ("high", cast(dimension.high))]
    drawn = " (type float draws fractions: use int)" if isinstance(dimension, FloatRange) else ""
    base = with_legacy_values(train.to_dict())
    if key == "effective_batch_size":  # a trial's split is derived from it: micro auto
        base["micro_batch_size"] = "auto"
    for name, value in values:
        try:
            TrainConfig.model_validate({**base, key: value})
        except ValidationError as error:
            problems = [e for e in error.errors() if tuple(e["loc"][:1]) == (key,)]
            if problems:
                where = f"search_space.{key}: " + (
                    f"choice {value!r}" if name == "choice" else f"{name}={value!r}")
                hint = drawn if problems[0]["type"] == "int_type" else ""
                raise rule_error(where, _must_be(key, problems[0]) + hint) from None


def _must_be(key: str, item: dict) -> str:
    """What the value of a training or tuning key must be: a field validator's own message,
    else the field's description."""
    if item["type"] == "value_error":  # a field validator's own message
        return str(item["ctx"]["error"])
    field = TrainConfig.model_fields.get(key) or TuningConfig.model_fields.get(key)
    return f"must be {field.description}" if field and field.description else item["msg"]

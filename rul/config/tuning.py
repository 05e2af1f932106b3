"""TuningConfig, what `rul tune` reads: the base training config, the study's own keys
(rul.config.study) and the rules that relate the two (each search-space dimension checked
against the training config, the baseline trial)."""

import warnings
from typing import Any

from pydantic import Field, ValidationError, model_validator

from rul.config.spelling import _did_you_mean
from rul.config.study import Categorical, FloatRange, IntRange, StudyKeys
from rul.config.training import NOT_TUNABLE, TrainConfig, with_legacy_values
from rul.config.validation import must_be, validated
from rul.config.values import rule_error

SPLIT_IN_SPACE = (
    "search_space lists {}: with exact accumulation micro_batch_size x accumulation_steps only "
    "splits the effective batch, which alone decides the model, so the sampler spends trials on "
    "splits of one batch and reads noise as signal. Search effective_batch_size instead: each "
    "trial then picks its micro-batch by measured memory (micro_batch_size: auto).")


class TuningConfig(StudyKeys):
    """What `rul tune` reads: the base training config (`train`) and the study's own keys.
    In YAML both sit side by side at the top level; `load_tuning` splits them."""

    train: TrainConfig = Field(default_factory=TrainConfig)
    """The base training config of every trial (in YAML its keys sit at the top level beside the
    tuning keys)."""

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
        return validated(TuningConfig, with_legacy_values(self.to_dict()), changes)



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
                raise rule_error(where, must_be(TrainConfig, key, problems[0]) + hint) from None

"""Run configuration: typed pydantic models for `rul train` (TrainConfig) and `rul tune`
(TuningConfig), read from YAML plus `key=value` overrides and validated before any work starts.

Defaults live only in the models; the YAML files in experiments/ override them. Every problem
becomes one line of a ConfigError: `<source>: <key>=<value>: <what is wrong>`.
"""

import difflib
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rul.data.schema import OPERATING_CONDITIONS, SUBSETS
from rul.errors import ConfigError
from rul.models.spec import (
    ARCHITECTURE_DEFAULTS,
    DEFAULT_KIND,
    DEFAULT_RUL_CAP,
    DEFAULT_WINDOW,
    KINDS,
)

__all__ = ["ConfigError", "TrainConfig", "TuningConfig", "build", "build_tuning", "load",
           "load_tuning"]


# ------------------------------------------------------------------ value types
# A field's description is what an error says its value must be.

_CLEAN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads 3e-4 (no dot) as a string: a clean numeric string counts as a number."""
    if isinstance(value, str) and _CLEAN_NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def _number(description: str, **bounds) -> Any:
    return Annotated[float, BeforeValidator(_yaml_number),
                     Field(allow_inf_nan=False, description=description, **bounds)]


def _one_of(*choices: str) -> Any:
    return Annotated[Literal[choices], Field(description="one of " + ", ".join(choices))]


PositiveInt = Annotated[int, Field(ge=1, description="a positive integer")]
NonNegativeInt = Annotated[int, Field(ge=0, description="a non-negative integer")]
Flag = Annotated[bool, Field(description="true or false")]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")


def parse_bytes(value: Any) -> Any:
    """'6GiB', '512MiB', '1.5GB' or a plain number of bytes -> int bytes (> 0)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    text = str(value).strip().lower()
    match = _BYTES.fullmatch(text)
    if isinstance(value, bool) or not match or match.group(2) not in _UNITS:
        raise ValueError("must be a memory size such as 6GiB, 512MiB or 2GB (or null)")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size <= 0:
        raise ValueError("must be a memory size greater than 0 (such as 512MiB)")
    return size


MemorySize = Annotated[int | None, BeforeValidator(parse_bytes), Field(
    description="a memory size such as 6GiB or 512MiB, or null")]
MicroBatch = Annotated[PositiveInt | Literal["auto"], Field(
    description="a positive integer or auto")]


def _path_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


Text = Annotated[str, BeforeValidator(_path_text), Field(description="a string")]
OptionalText = Annotated[str | None, BeforeValidator(_path_text),
                         Field(description="a string or null")]


def rule_error(where: str, message: str) -> PydanticCustomError:
    """A cross-field rule's error; `where` is usually `key=value`."""
    return PydanticCustomError("config_rule", "{where}: {message}",
                               {"where": where, "message": message})


class _Strict(BaseModel):
    """No unknown keys, no silent coercion (true is not 1, 2.5 is not an int), immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# ------------------------------------------------------------------ training


warnings.filterwarnings("ignore", message='Field name "register" in "TrainConfig" shadows')


class TrainConfig(_Strict):  # `register` shadows ABCMeta.register, harmless on instances
    """Everything `rul train` reads; the defaults are the default FD001 run (`make train`)."""

    # data and preprocessing
    subset: _one_of(*SUBSETS) = "FD001"
    """Which C-MAPSS subset to train and test on (FD001: one operating condition, one fault
    mode)."""
    data_dir: OptionalText = None
    """Folder holding train_FDxxx.txt, test_FDxxx.txt and RUL_FDxxx.txt; null: CMAPSS_DIR, then
    the cache data/cmapss/, then a verified download."""
    window: PositiveInt = DEFAULT_WINDOW
    """Cycles per input window: the model sees a unit's last `window` cycles."""
    rul_cap: PositiveInt = DEFAULT_RUL_CAP
    """Cap of the piecewise-linear RUL target in cycles: early in life the target stays at the
    cap; predictions and interval bounds never exceed it."""
    features: Annotated[str | list[str], Field(
        description="'informative', 'all' or a list of sensor columns")] = "informative"
    """Sensor columns fed to the model: the 14 informative sensors, all 21, or an explicit list
    such as [s_2, s_3]."""
    include_settings: Flag = False
    """Also feed the three operational settings as inputs."""
    include_cycle: Flag = False  # the engine's age in cycles as one more input column
    """Feed the engine's age (cycles since the start of its record) as one more input column.
    It assumes that `cycle` counts from each engine's first cycle in service, in a fleet whose
    lives resemble the training fleet's (see Concepts: inputs)."""
    late_start_max: NonNegativeInt = 0
    """Train on records that start a random 0..N cycles late (drawn per training engine from
    the split seed, renumbered from 1), as records begun after wear nobody counted: the age is
    then not exact in training. Validation and test records stay as recorded."""
    drop_constant: Flag = False
    """Drop input columns that are (nearly) constant within every operating condition of the
    training units."""
    normalization: _one_of("minmax", "zscore") = "minmax"
    """How inputs are scaled, fitted on the training units only: min-max to [-1, 1] or z-score."""
    condition_scaling: _one_of("auto", "global", "per_condition") = "auto"  # per_condition
    # for FD002/FD004 when auto
    """Scale sensors per operating condition or globally; auto: per condition for the subsets
    with six conditions (FD002, FD004)."""
    smoothing_alpha: _number("a number in (0, 1] (weight of the newest cycle; 1 = off)",
                             gt=0, le=1) = 0.1  # causal exponential smoothing per unit
    """Weight of the newest cycle in the causal exponential smoothing of each unit's sensors; 1
    turns smoothing off."""
    val_fraction: _number("a number between 0 and 1 (validation units for early stopping)",
                          gt=0, lt=1) = 0.2
    """Share of the training units held out (whole units) for early stopping, model selection and
    interval calibration."""
    # model (architecture defaults: rul.models.spec)
    model: _one_of(*KINDS) = DEFAULT_KIND
    """Network: the DCNN of Li et al. (2018), an LSTM, a GRU or a Transformer encoder."""
    hidden_size: PositiveInt = ARCHITECTURE_DEFAULTS["hidden_size"]
    """Width of the recurrent/Transformer layers, and of the DCNN's dense head."""
    num_layers: PositiveInt = ARCHITECTURE_DEFAULTS["num_layers"]
    """Number of layers: convolution layers of the DCNN, stacked recurrent or Transformer layers
    otherwise."""
    dropout: _number("a number in [0, 1)", ge=0, lt=1) = ARCHITECTURE_DEFAULTS["dropout"]
    """Dropout probability (the DCNN's head; between layers of the others)."""
    kernel_size: PositiveInt = ARCHITECTURE_DEFAULTS["kernel_size"]
    """Time steps covered by each DCNN convolution."""
    filters: PositiveInt = ARCHITECTURE_DEFAULTS["filters"]  # cnn
    """Channels of each DCNN convolution layer."""
    num_heads: PositiveInt = ARCHITECTURE_DEFAULTS["num_heads"]  # transformer
    """Attention heads of the Transformer; must divide hidden_size."""
    # optimization
    # The effective batch B is the accuracy decision; its split into micro-batches x K is a
    # memory and speed decision (exact accumulation: same B, same model). `auto` measures the
    # peak memory of a few micro sizes before training and picks the largest under
    # memory_budget (null: CUDA's free memory less a margin; CPU: half the available RAM),
    # with K = ceil(B / micro). With integers, B = micro x K unless stated.
    micro_batch_size: MicroBatch = 256
    """Samples per forward/backward pass: a memory and speed choice that does not change the
    model; auto measures peak memory and picks the largest that fits memory_budget."""
    accumulation_steps: PositiveInt = 2  # derived when micro_batch_size is auto
    """Micro-batches accumulated per optimizer step (K); derived when micro_batch_size is auto."""
    effective_batch_size: Annotated[PositiveInt | None, Field(
        description="a positive integer or null")] = None  # null: micro x K
    """Samples per optimizer step (B): the accuracy decision; null means micro_batch_size x
    accumulation_steps."""
    memory_budget: MemorySize = None
    """Peak memory allowed to micro_batch_size: auto; null: the free CUDA memory less 10 %, or
    half the available RAM on CPU."""
    epochs: PositiveInt = 100
    """Maximum number of passes over the training windows."""
    # cosine decay from 2e-3 to 0 over all epochs' steps: on validation units it beat the
    # constant 1e-3 at the same cost (docs: Results)
    lr: _number("a number > 0", gt=0) = 2e-3
    """Peak learning rate of AdamW (the cosine schedule decays it to 0)."""
    weight_decay: _number("a number >= 0", ge=0) = 0.0
    """AdamW's decoupled weight decay."""
    scheduler: _one_of("none", "cosine", "onecycle") = "cosine"
    """Learning-rate schedule over all optimizer steps: constant, cosine decay to 0, or one-
    cycle."""
    max_grad_norm: Annotated[_number("a number > 0", gt=0) | None, Field(
        description="a number > 0, or null to disable clipping")] = 1.0
    """Gradients are clipped to this global L2 norm after unscaling, once per optimizer step;
    null disables clipping."""
    ema_decay: _number("a number in [0, 1) (0 turns the weight average off)",
                       ge=0, lt=1) = 0.99  # evaluate a moving average of the weights
    """Decay of the exponential moving average of the weights used for validation, early stopping
    and the returned model; 0 turns it off."""
    precision: _one_of("auto", "fp32", "fp16", "bf16") = "auto"
    """Training arithmetic: auto picks fp16 on CUDA, bf16 on a CPU with native bf16 (for the
    DCNN) and fp32 otherwise; evaluation always runs in float32."""
    seed: NonNegativeInt = 42
    """Seed of the validation split, weight init, dropout and batch order; the same seed and
    machine give the same run."""
    # members of an ensemble model: seeds seed .. seed+N-1 (init and batch order), one shared
    # validation split (that of `seed`); their predictions are averaged (docs: Evaluate)
    ensemble: PositiveInt = 1
    """Members of an ensemble model (seeds seed .. seed+N-1), whose predictions are averaged into
    one served model."""
    # how the members split the training units: "shared", all on the validation split of `seed`
    # (val_fraction); "folds", the units cut into N folds by seed's permutation: member i
    # early-stops on fold i and trains on the others (val_fraction unused), so the ensemble
    # learns from every training unit and its val_rmse is out-of-fold (docs: Evaluate)
    ensemble_split: _one_of("shared", "folds") = "shared"
    """How ensemble members split the training units: all on the validation split of `seed`
    (shared), or one fold each (folds: out-of-fold validation)."""
    deterministic: Flag = False
    """Ask torch for deterministic algorithms (slower; needed for bitwise-equal runs on CUDA)."""
    patience: PositiveInt = 20
    """Epochs without a better validation RMSE before early stopping ends the run."""
    strict_data: Flag = False
    """Refuse a training file with odd inputs (gaps in the cycles, late first cycles, values far
    from the fleet's) instead of naming them in a warning and training on them."""
    device: _one_of("auto", "cpu", "cuda") = "auto"
    """Where to train: auto (CUDA when available), cpu or cuda."""
    # prediction intervals of the logged model: split conformal on the validation windows
    interval_coverage: Annotated[_number("a number strictly between 0 and 1", gt=0, lt=1)
                                 | None, Field(description="a number strictly between 0 and 1"
                                               ", or null to disable prediction intervals")
                                 ] = 0.9
    """Target coverage of the prediction interval (split conformal, calibrated on the validation
    windows); null: the model returns no bounds."""
    # tracking and outputs
    tracking_uri: OptionalText = None
    """MLflow store for the run; null: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db with
    artifacts in ./mlruns."""
    experiment: OptionalText = None  # default rul-<subset>
    """MLflow experiment name; null: rul-<subset>."""
    register: Flag = True
    """Register the model as rul-<subset> and move the champion alias when validation RMSE
    improves."""
    run_name: OptionalText = None
    """MLflow run name; null: model, effective batch, K and seed, e.g. cnn-b512-k2-s42."""
    checkpoint_dir: Text = "mlruns/checkpoints"
    """Folder of the per-epoch checkpoints that `rul train --resume` continues from."""

    @field_validator("subset", mode="before")
    @classmethod
    def _canonical_subset(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().upper() in SUBSETS:
            return value.strip().upper()  # fd001 -> FD001
        return value

    @field_validator("features")
    @classmethod
    def _known_features(cls, value: str | list[str]) -> str | list[str]:
        from rul.preprocessing.features import candidate_columns

        candidate_columns(value, include_settings=False)  # ValueError names the problem
        return value

    @model_validator(mode="before")
    @classmethod
    def _state_the_effective_batch(cls, values: Any) -> Any:
        """Fill in B = micro x K when both are integers and B is not stated."""
        if isinstance(values, dict) and values.get("effective_batch_size") is None:
            micro = values.get("micro_batch_size", cls.model_fields["micro_batch_size"].default)
            k = values.get("accumulation_steps", cls.model_fields["accumulation_steps"].default)
            if _positive_int(micro) and _positive_int(k):
                values = {**values, "effective_batch_size": micro * k}
        return values

    @model_validator(mode="after")
    def _split_matches_the_effective_batch(self) -> "TrainConfig":
        b, micro, k = self.effective_batch_size, self.micro_batch_size, self.accumulation_steps
        if micro == "auto":
            if b is None:
                raise rule_error("micro_batch_size='auto'",
                                 "needs effective_batch_size (the batch the optimizer sees)")
        elif micro > b or -(-b // micro) != k:
            raise rule_error(f"effective_batch_size={b}",
                             f"disagrees with micro_batch_size={micro} x accumulation_steps={k}"
                             " (B must be micro x K, or K = ceil(B / micro) with a short last"
                             " micro-batch)")
        return self

    @model_validator(mode="after")
    def _transformer_heads_divide_width(self) -> "TrainConfig":
        if self.model == "transformer" and self.hidden_size % self.num_heads:
            raise rule_error(f"hidden_size={self.hidden_size}",
                             f"must be divisible by num_heads={self.num_heads}")
        return self

    @model_validator(mode="after")
    def _folds_need_members(self) -> "TrainConfig":
        if self.ensemble_split == "folds" and self.ensemble < 2:
            raise rule_error("ensemble_split='folds'", f"needs ensemble >= 2 (member i validates "
                             f"on fold i of N), got ensemble={self.ensemble}")
        return self

    @property
    def n_conditions(self) -> int:
        if self.condition_scaling == "per_condition":
            return 6
        if self.condition_scaling == "global":
            return 1
        return OPERATING_CONDITIONS[self.subset]

    @property
    def experiment_name(self) -> str:
        return self.experiment or f"rul-{self.subset.lower()}"

    def to_dict(self) -> dict[str, Any]:
        """The keys a YAML file would hold: B only when it is not micro x K, and the keys of
        OMITTED_AT_DEFAULT only when they differ from their default (so configs written
        before those keys existed keep their form, params and identity)."""
        values = self.model_dump()
        if self.micro_batch_size != "auto" and (
                self.effective_batch_size == self.micro_batch_size * self.accumulation_steps):
            del values["effective_batch_size"]
        for key in OMITTED_AT_DEFAULT:
            if values[key] == type(self).model_fields[key].default:
                del values[key]
        return values

    def identity(self) -> dict[str, Any]:
        """What decides the trained model: the written keys less NOT_IN_IDENTITY (the same
        identity -> the same run, which is what `--resume` looks for)."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_IN_IDENTITY}

    def replace(self, **changes) -> "TrainConfig":
        """A re-validated copy with `changes` applied."""
        return build(self.to_dict(), changes)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


Config = TrainConfig

# ------------------------------------------------------------------ what each key decides
# Every training key changes what is trained, and so belongs to a run's identity, unless it
# has a role here. The key lists that resuming, tuning and studies need are derived from these
# roles and nowhere else.
KEY_ROLES = {
    # where data and results live
    **dict.fromkeys(("data_dir", "tracking_uri", "experiment", "register", "run_name",
                     "checkpoint_dir"), "place"),
    "device": "machine",  # where it runs: a run may resume on another machine
    # how it computes: the same model up to rounding (the machines of one study may differ)
    **dict.fromkeys(("precision", "deterministic", "memory_budget"), "numerics"),
    "interval_coverage": "calibration",  # after training: the network is the same
    **dict.fromkeys(("ensemble", "ensemble_split"), "members"),  # how many networks
    "subset": "dataset",  # which engines: every trial of a study trains on the same
    "strict_data": "checks",  # refuses odd inputs or warns: what trains is the same
}
# Keys added after runs were first tracked, written only when they differ from their default.
OMITTED_AT_DEFAULT = ("memory_budget", "ensemble", "ensemble_split", "include_cycle",
                      "late_start_max", "strict_data")


def keys_with(*roles: str) -> tuple[str, ...]:
    return tuple(key for key, role in KEY_ROLES.items() if role in roles)


# Not part of a run's identity: where things live, the machine, the calibration after training.
NOT_IN_IDENTITY = keys_with("place", "machine", "calibration", "checks")
# Keys a study may not vary: those, and what a trial always trains on (one network, one subset).
NOT_TUNABLE = keys_with("place", "machine", "calibration", "members", "dataset", "checks")
# Keys the invocations of one study may differ in: where and how fast a trial runs, not what
# it trains (e.g. fp16 on a GPU and fp32 on a CPU).
NOT_COMPARED_IN_A_STUDY = keys_with("place", "machine", "numerics", "calibration", "checks")

SPLIT_IN_SPACE = (
    "search_space lists {}: with exact accumulation micro_batch_size x accumulation_steps only "
    "splits the effective batch, which alone decides the model, so the sampler spends trials on "
    "splits of one batch and reads noise as signal. Search effective_batch_size instead: each "
    "trial then picks its micro-batch by measured memory (micro_batch_size: auto).")
SPACE_HINT = "needs type categorical (choices) or int/float (low, high, optional log)"

# ------------------------------------------------------------------ tuning


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

    def _smallest(self, key: str) -> int:
        dimension = self.search_space.get(key)
        if dimension is None:
            return getattr(self.train, key)
        if isinstance(dimension, Categorical):
            return min(dimension.choices)  # checked above: positive integers
        return int(dimension.low)

    @property
    def effective_study_name(self) -> str:
        return self.study_name or f"rul-{self.train.subset.lower()}-tune"

    def to_dict(self) -> dict[str, Any]:
        """The flat form of the YAML file: training keys and tuning keys side by side."""
        tuning = self.model_dump(exclude={"train", "search_space"})
        space = {k: d.model_dump(exclude_unset=True) for k, d in self.search_space.items()}
        return {**self.train.to_dict(), **tuning, "search_space": space}

    def replace(self, **changes) -> "TuningConfig":
        """A re-validated copy; `changes` may hold training and tuning keys."""
        return build_tuning(self.to_dict(), changes)


# Keys read by `rul tune` only (TuningConfig's own fields).
TUNING_KEYS = tuple(k for k in TuningConfig.model_fields if k != "train")


def _check_dimension(train: TrainConfig, key: str, dimension) -> None:
    """Each value a trial can draw must be valid for `key` on its own (cross-field rules such
    as transformer heads are left to the trial, which is pruned)."""
    if isinstance(dimension, Categorical):
        values = [("choice", v) for v in dimension.choices]
    else:
        cast = int if isinstance(dimension, IntRange) else float
        values = [("low", cast(dimension.low)), ("high", cast(dimension.high))]
    drawn = " (type float draws fractions: use int)" if isinstance(dimension, FloatRange) else ""
    base = train.to_dict()
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


# ------------------------------------------------------------------ loading


def load(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> TrainConfig:
    """Read a YAML config (or none: defaults) and apply overrides ('key=value' strings)."""
    values, changes, source, changes_source = _read(path, overrides)
    return build(values, changes, source, changes_source)


def load_tuning(path: str | Path | None = None,
                overrides: list[str] | dict | None = None) -> TuningConfig:
    """Read a flat tuning YAML (training and tuning keys side by side) and apply overrides."""
    values, changes, source, changes_source = _read(path, overrides)
    return build_tuning(values, changes, source, changes_source)


def build(values: dict, changes: dict | None = None, source: str = "config",
          changes_source: str | None = None) -> TrainConfig:
    """`values` (from `source`) with `changes` (from `changes_source`, default `source`)
    applied; an error names the source of the key it is about."""
    changes = _auto_keeps_the_batch(values, changes or {}, announce=changes_source is not None)
    merged = {**values, **changes}
    return _validate(TrainConfig, merged, merged,
                     _Origins(source, changes_source, set(values), set(changes)))


def build_tuning(values: dict, changes: dict | None = None, source: str = "config",
                 changes_source: str | None = None) -> TuningConfig:
    changes = _auto_keeps_the_batch(values, changes or {}, announce=changes_source is not None)
    merged = {**values, **changes}
    tuning = {k: v for k, v in merged.items() if k in TUNING_KEYS}
    train = {k: v for k, v in merged.items() if k not in TUNING_KEYS}
    return _validate(TuningConfig, {**tuning, "train": train}, merged,
                     _Origins(source, changes_source, set(values), set(changes)))


def _auto_keeps_the_batch(values: dict, changes: dict, announce: bool) -> dict:
    """`micro_batch_size=auto` as a change, with no effective_batch_size stated anywhere:
    the effective batch stays the one `values` (and the defaults) imply, micro x K, so that
    asking for the automatic split never changes the model. Said on stderr when `announce`."""
    if (changes.get("micro_batch_size") != "auto" or "effective_batch_size" in changes
            or values.get("effective_batch_size") is not None):
        return changes
    fields = TrainConfig.model_fields
    micro = values.get("micro_batch_size", fields["micro_batch_size"].default)
    k = values.get("accumulation_steps", fields["accumulation_steps"].default)
    if not (_positive_int(micro) and _positive_int(k)):
        return changes  # the file's own split is auto or invalid: its error says so
    if announce:
        print(f"micro_batch_size=auto keeps the effective batch of the config, {micro} x {k} = "
              f"{micro * k} (state effective_batch_size to change it)", file=sys.stderr)
    return {**changes, "effective_batch_size": micro * k}


COMMAND_LINE = "command line"


def _read(path, overrides) -> tuple[dict, dict, str, str]:
    """(the file's values, the overrides, the name of each's source)."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        values = _yaml_mapping(path)
    if isinstance(overrides, dict):
        changes, changes_source = overrides, "overrides"
    else:
        changes = dict(_parse_override(item) for item in overrides or [])
        changes_source = COMMAND_LINE
    return values, changes, str(path) if path is not None else "config", changes_source


def _yaml_mapping(path: Path) -> dict:
    """The file's mapping; any problem is one line `file:line:column: what is wrong`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {error.start}: "
                          f"{error.reason})") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({error.strerror})") from None
    try:
        values = yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as error:
        raise ConfigError(_yaml_problem(path, error)) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    return values


def _yaml_problem(path: Path, error: yaml.MarkedYAMLError) -> str:
    mark = error.problem_mark or error.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    what = error.problem or error.context or "unreadable"
    context = error.context_mark
    if error.problem and error.context and context is not None and (
            context.line, context.column) != (mark.line, mark.column):
        what += f" ({error.context} that starts at {context.line + 1}:{context.column + 1})"
    elif error.problem and error.context:
        what += f" ({error.context})"
    return f"{where}: not valid YAML: {what}"


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{COMMAND_LINE}: override {item!r} must look like key=value")
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError:
        return key.strip(), raw


# ------------------------------------------------------------------ errors


class _Origins:
    """Where each key's value came from: the file (or `config`: the defaults) or the
    overrides (the command line)."""

    def __init__(self, file: str, changes: str | None, written: set, changed: set):
        self.file, self.changes = file, changes or file
        self.written, self.changed = written - changed, changed

    def of_key(self, key) -> str:
        return self.changes if key in self.changed else self.file

    def of_rule(self, line: str) -> str:
        """A cross-field rule names its keys (`key=value`, the first one leading): the
        sources of those keys, the file's (or the defaults') when none was written."""
        named = {*re.findall(r"\b([a-z_]+)=", line), re.match(r"[a-z_]*", line).group()}
        sources = [self.file] if named & self.written else []
        if named & self.changed:
            sources.append(self.changes)
        return " and ".join(dict.fromkeys(sources)) or self.file


def _validate(model: type[BaseModel], data: dict, flat: dict, origins: _Origins):
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_explain(error, model, flat, origins)) from None


def _explain(error: ValidationError, model: type[BaseModel], flat: dict,
             origins: _Origins) -> str:
    """One line per problem, unknown keys first, each naming where its value came from (the
    file or the command line); never pydantic's own dump."""
    unknown, lines = [], []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        if loc[:1] == ("train",) and model is TuningConfig:
            loc = loc[1:]
        if item["type"] == "extra_forbidden" and len(loc) == 1:
            unknown.append(loc[0])
            continue
        if loc[:1] == ("search_space",) and len(loc) > 1:
            line = _space_problem(str(loc[1]), loc[2:], item, flat.get("search_space"))
            source = origins.of_key("search_space")
        elif item["type"] == "config_rule":
            line = item["msg"]
            source = origins.of_rule(line)
        else:
            key = loc[0]
            line = f"{key}={flat.get(key)!r}: {_must_be(key, item)}"
            source = origins.of_key(key)
        if f"{source}: {line}" not in lines:
            lines.append(f"{source}: {line}")
    by_source = {}
    for key in unknown:
        by_source.setdefault(origins.of_key(key), []).append(key)
    named = [line for source, keys in by_source.items()
             for line in _unknown_keys(keys, model, source)]
    return "\n".join(sorted(named, key=lambda line: "unknown key" not in line) + lines)


def _must_be(key: str, item: dict) -> str:
    if item["type"] == "value_error":  # a field validator's own message
        return str(item["ctx"]["error"])
    field = TrainConfig.model_fields.get(key) or TuningConfig.model_fields.get(key)
    return f"must be {field.description}" if field and field.description else item["msg"]


def _unknown_keys(keys: list, model: type[BaseModel], source: str) -> list[str]:
    lines = []
    if model is TrainConfig:
        tuning = [k for k in keys if k in TUNING_KEYS]
        keys = [k for k in keys if k not in TUNING_KEYS]
        if tuning:
            names = ", ".join(repr(k) for k in tuning)
            verb = "is a tuning key" if len(tuning) == 1 else "are tuning keys"
            lines.append(f"{source}: {names} {verb} used by `rul tune`, not by `rul train`")
        known = list(TrainConfig.model_fields)
    else:
        known = [*TrainConfig.model_fields, *TUNING_KEYS]
    if keys:
        hints = ", ".join(f"{k!r}{_did_you_mean(str(k), known)}" for k in keys)
        lines.insert(0, f"{source}: unknown key(s) {hints}")
    return lines


# Names other tools use for our keys, so a hint can point from them (or their typos) to ours.
ALIASES = {"learning_rate": "lr", "batch_size": "micro_batch_size", "num_epochs": "epochs",
           "n_epochs": "epochs", "grad_accumulation": "accumulation_steps",
           "clip_grad_norm": "max_grad_norm", "grad_clip": "max_grad_norm",
           "window_size": "window", "sequence_length": "window", "amp": "precision"}


def _did_you_mean(key: str, known) -> str:
    known = list(known)
    names = known + [alias for alias, target in ALIASES.items() if target in known]
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {ALIASES.get(close[0], close[0])!r}?)" if close else ""


def _space_problem(key: str, rest: tuple, item: dict, space: Any) -> str:
    spec_values = space.get(key) if isinstance(space, dict) else None
    where = f"search_space.{key}"
    if item["type"] == "config_rule":  # low/high order, log bounds
        return f"{where}: {item['msg']}"
    if len(rest) < 2:  # the entry itself: not a mapping, or no/unknown type
        return f"{where}: {SPACE_HINT}"
    kind, name = rest[0], rest[1]
    spec = {"categorical": Categorical, "int": IntRange, "float": FloatRange}[kind]
    if item["type"] == "missing":
        needs = "choices" if kind == "categorical" else "low, high and optional log"
        return f"{where}: {name} is missing ({kind} needs {needs})"
    if item["type"] == "extra_forbidden":
        return f"{where}: unknown key {name!r}{_did_you_mean(str(name), spec.model_fields)}"
    field = spec.model_fields[name]
    wanted = f"must be {field.description}" if field.description else item["msg"]
    given = spec_values.get(name, item["input"]) if isinstance(spec_values, dict) else None
    value = given if len(rest) > 2 else item["input"]  # inside a list: show the whole list
    return f"{where}: {name}={value!r}: {wanted}"

"""TrainConfig, everything `rul train` reads, and what each of its keys decides: KEY_ROLES and
the key lists derived from it (a run's identity, what a study may vary or compare)."""

import warnings
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from rul.config.data import DataSection, preset
from rul.config.validation import validated
from rul.config.values import (
    Flag,
    MemorySize,
    MicroBatch,
    NonNegativeInt,
    OptionalText,
    PositiveInt,
    Text,
    _number,
    _one_of,
    _positive_int,
    _Strict,
    rule_error,
)
from rul.data.schema import SUBSETS
from rul.files import DATA_LIMIT, SizeLimit
from rul.models.spec import ARCHITECTURE_ARGS, KINDS, NETWORK_KINDS
from rul.preprocessing.censored import CHOICES as CENSORED_TRAINING
from rul.training.optimizers import OPTIMIZER_KINDS

warnings.filterwarnings("ignore", message='Field name "register" in "TrainConfig" shadows')


class TrainConfig(_Strict):  # `register` shadows ABCMeta.register, harmless on instances
    """Everything `rul train` reads. Its defaults are `make train`'s recipe, and this is their
    one home: a config that names only its data set trains it, and the precision probe, the
    benches and `make tune` build it from here. Why each value: docs/results.md (Decisions)."""

    # data and preprocessing
    subset: _one_of(*SUBSETS) = "FD001"
    """Which C-MAPSS subset to train and test on (FD001: one operating condition, one fault
    mode)."""
    data: Annotated[DataSection | None, Field(
        description="a mapping (name, train, unit, time, settings, sensors, ...), or null"
    )] = None
    """Your own data set, described by its columns (files, unit, time, settings, sensors;
    see Train on your own fleet); null: the C-MAPSS subset named by `subset`."""
    data_dir: OptionalText = None
    """Folder holding train_FDxxx.txt, test_FDxxx.txt and RUL_FDxxx.txt; null: CMAPSS_DIR, then
    the cache data/cmapss/, then a verified download."""
    max_data_mb: _number("a number of megabytes > 0", gt=0) = DATA_LIMIT.megabytes
    """The largest data file read, in MB: a larger one is refused before it is read (it would
    cost memory several times its size)."""
    window: PositiveInt = 30
    """Cycles per input window: the model sees a unit's last `window` cycles."""
    rul_cap: PositiveInt = 125
    """Cap of the piecewise-linear RUL target in cycles: early in life the target stays at the
    cap; predictions and interval bounds never exceed it."""
    features: Annotated[str | list[str], Field(
        description="'informative', 'all' or a list of sensor columns")] = "informative"
    """Sensor columns fed to the model: the 14 informative sensors, all 21, or an explicit list
    such as [s_2, s_3]."""
    include_settings: Flag = False
    """Also feed the three operational settings as inputs."""
    include_cycle: Flag = False
    """Feed the engine's age (cycles since the start of its record) as one more input column.
    It assumes that `cycle` counts from each engine's first cycle in service, in a fleet whose
    lives resemble the training fleet's (see Concepts: inputs)."""
    late_start_max: NonNegativeInt = 0
    """Train on records that start a random 0..N cycles late (drawn per training engine from
    the split seed, renumbered from 1), as records begun after wear nobody counted: the age is
    then not exact in training. Validation and test records stay as recorded."""
    censored_training: _one_of(*CENSORED_TRAINING) = "known"
    """What the engines still in service (a `data:` section's censored engines) teach: seen up
    to cycle T, each is a lower bound on the RUL at every cycle t (RUL > T - t). known: only
    their windows whose target that makes known (T - t at least the cap: the cap); lower_bound:
    every window, the loss penalising a prediction below min(T - t, cap) and above the cap,
    never one between; dropped: none. They never validate (docs: Results, Engines still in
    service)."""
    drop_constant: Flag = False
    """Drop input columns that are (nearly) constant within every operating condition of the
    training units."""
    normalization: _one_of("minmax", "zscore") = "minmax"
    """How inputs are scaled, fitted on the training units only: min-max to [-1, 1] or z-score."""
    condition_scaling: _one_of("auto", "global", "per_condition") = "auto"
    """Scale sensors per operating condition or globally; auto: per condition for the subsets
    with six conditions (FD002, FD004)."""
    smoothing_alpha: _number("a number in (0, 1] (weight of the newest cycle; 1 = off)",
                             gt=0, le=1) = 0.1
    """Weight of the newest cycle in the causal exponential smoothing of each unit's sensors; 1
    turns smoothing off."""
    val_fraction: _number("a number between 0 and 1 (validation units for early stopping)",
                          gt=0, lt=1) = 0.2
    """Share of the training units held out (whole units) for early stopping, model selection and
    interval calibration."""
    # model (its kinds: rul.models.spec.NETWORK_KINDS)
    model: _one_of(*KINDS) = "cnn"
    """Network: the DCNN of Li et al. (2018), an LSTM, a GRU or a Transformer encoder."""
    hidden_size: PositiveInt = 50
    """Width of the recurrent/Transformer layers, and of the DCNN's dense head."""
    num_layers: PositiveInt = 4
    """Number of layers: convolution layers of the DCNN, stacked recurrent or Transformer layers
    otherwise."""
    dropout: _number("a number in [0, 1)", ge=0, lt=1) = 0.746
    """Dropout probability (the DCNN's head; between layers of the others)."""
    kernel_size: PositiveInt = 14
    """Time steps covered by each DCNN convolution."""
    filters: PositiveInt = 10  # cnn
    """Channels of each DCNN convolution layer."""
    num_heads: PositiveInt = 4  # transformer
    """Attention heads of the Transformer; must divide hidden_size."""
    # optimization: the effective batch B decides the model, its split micro x K only memory
    # and speed (docs: Concepts, The training step)
    micro_batch_size: MicroBatch = 256
    """Samples per forward/backward pass: a memory and speed choice that does not change the
    model; auto measures peak memory and picks the largest that fits memory_budget."""
    accumulation_steps: PositiveInt = 2
    """Micro-batches accumulated per optimizer step (K); derived when micro_batch_size is auto."""
    effective_batch_size: Annotated[PositiveInt | None, Field(
        description="a positive integer or null")] = None
    """Samples per optimizer step (B): the accuracy decision; null means micro_batch_size x
    accumulation_steps."""
    memory_budget: MemorySize = None
    """Peak memory allowed to micro_batch_size: auto; null: the free CUDA memory less 10 %, or
    half the available RAM on CPU."""
    epochs: PositiveInt = 35
    """Maximum number of passes over the training windows."""
    optimizer: _one_of(*OPTIMIZER_KINDS) = "muon"
    """AdamW, or Muon for the weight matrices and convolution filters with AdamW for the rest
    (rul.training.muon); both share lr, weight_decay and the schedule. The optimizers and what
    each can do: rul.training.optimizers."""
    lr: _number("a number > 0", gt=0) = 0.0148
    """Peak learning rate of the optimizer (the cosine schedule decays it to 0)."""
    weight_decay: _number("a number >= 0", ge=0) = 0.0
    """Decoupled weight decay: each step shrinks the weights by lr x weight_decay (AdamW's,
    and Muon's matrices alike)."""
    scheduler: _one_of("none", "cosine", "onecycle") = "cosine"
    """Learning-rate schedule over all optimizer steps: constant, cosine decay to 0, or one-
    cycle."""
    warmup_epochs: NonNegativeInt = 1
    """Epochs over which the learning rate rises linearly to `lr` before the schedule (cosine:
    decaying to 0 over the steps left; none: constant); 0 turns the warm-up off. A large
    effective batch takes a larger rate, which a warm-up keeps from diverging early. At most
    `epochs` (a run that short is all warm-up)."""
    max_grad_norm: Annotated[_number("a number > 0", gt=0) | None, Field(
        description="a number > 0, or null to disable clipping")] = 1.0
    """Gradients are clipped to this global L2 norm after unscaling, once per optimizer step;
    null disables clipping."""
    train_sampling: _one_of("windows", "truncation") = "truncation"
    """How each epoch draws its training windows: every full window once, shuffled (windows),
    or as many windows drawn with replacement as the test units are cut off, each training
    engine equally often at points over its life (truncation: the law of
    rul.evaluation.truncation), so that long engines and the cycles at the RUL cap weigh no
    more than the test gives them. An epoch takes as many steps either way."""
    val_weights: _one_of("windows", "truncation") = "windows"
    """How the validation RMSE (early stopping, a study's objective, the val RMSE reported)
    weighs the validation windows: every full window once (windows), or as the test units are
    cut off, each validation engine counting once at points drawn over its life (truncation:
    the interval's calibration weights, rul.evaluation.truncation)."""
    ema_decay: _number("a number in [0, 1) (0 turns the weight average off)",
                       ge=0, lt=1) = 0.998
    """Decay of the exponential moving average of the weights used for validation, early stopping
    and the returned model; 0 turns it off."""
    precision: _one_of("auto", "fp32", "fp16", "bf16") = "auto"
    """Training arithmetic: auto picks the fastest measured to keep fp32's accuracy on this
    device (docs: Concepts, Precision); evaluation always runs in float32."""
    seed: NonNegativeInt = 42
    """Seed of the weight init, dropout and batch order; the same seed (and split_seed) and
    machine give the same run."""
    split_seed: NonNegativeInt = 42
    """Seed of the validation split: which engines validate. The same whatever `seed` is, so
    that a config's runs, and the registered versions they make, are scored on the same
    engines; `rul evaluate` and a study's seeds_per_trial vary it with the seed on purpose."""
    # an ensemble's members (docs: Train, Ensembles)
    ensemble: PositiveInt = 1
    """Members of an ensemble model (seeds seed .. seed+N-1), whose predictions are averaged into
    one served model."""
    ensemble_split: _one_of("shared", "folds") = "shared"
    """How ensemble members split the training units: all on the validation split of `seed`
    (shared), or the units in N folds, member i validating on fold i and training on the
    others (folds: out-of-fold validation, val_fraction unused)."""
    ensemble_training: _one_of("auto", "sequential", "stacked") = "auto"
    """How ensemble members train: one after another (sequential, or --jobs side by side), all
    at once with their weights stacked (stacked: fp32 and an elementwise optimizer only), or
    as measured fastest on the device (auto: rul.training.stacked)."""
    deterministic: Flag = False
    """Ask torch for deterministic algorithms (slower; needed for bitwise-equal runs on CUDA)."""
    patience: PositiveInt = 40
    """Epochs without a better validation RMSE before early stopping ends the run."""
    strict_data: Flag = False
    """Refuse a training file with odd inputs (gaps in the cycles, late first cycles, values far
    from the fleet's) instead of naming them in a warning and training on them."""
    device: _one_of("auto", "cpu", "cuda") = "auto"
    """Where to train: auto (CUDA when available), cpu or cuda."""
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
    experiment: OptionalText = None
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

    @model_validator(mode="before")
    @classmethod
    def _subset_or_data(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("data") is not None and "subset" in values:
            raise rule_error("data", "describes the data set, so subset names none: give one "
                                     "of them")
        return values

    @model_validator(mode="after")
    def _known_features(self) -> "TrainConfig":
        """C-MAPSS's sensors are known now; a data set's are checked when its table is read
        (its names may be patterns)."""
        from rul.preprocessing.features import candidate_columns

        if self.data is None:
            try:
                candidate_columns(self.features, include_settings=False)
            except ValueError as error:
                raise rule_error(f"features={self.features!r}", str(error)) from None
        return self

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
    def _architecture_fits_its_kind(self) -> "TrainConfig":
        if problem := NETWORK_KINDS[self.model].problem(self.architecture):
            raise rule_error(*problem)
        return self

    @model_validator(mode="after")
    def _warmup_fits_the_schedule(self) -> "TrainConfig":
        if self.warmup_epochs and self.scheduler == "onecycle":
            raise rule_error(f"warmup_epochs={self.warmup_epochs}", "scheduler='onecycle' "
                             "warms up itself: give warmup_epochs=0 or another scheduler")
        if self.warmup_epochs > self.epochs:  # equal: a short try of a recipe, all warm-up
            raise rule_error(f"warmup_epochs={self.warmup_epochs}",
                             f"must be at most epochs={self.epochs}")
        return self

    @model_validator(mode="after")
    def _folds_need_members(self) -> "TrainConfig":
        if self.ensemble_split == "folds" and self.ensemble < 2:
            raise rule_error("ensemble_split='folds'", f"needs ensemble >= 2 (member i validates "
                             f"on fold i of N), got ensemble={self.ensemble}")
        return self

    @model_validator(mode="after")
    def _member_training_needs_members(self) -> "TrainConfig":
        if self.ensemble_training != "auto" and self.ensemble < 2:
            raise rule_error(f"ensemble_training='{self.ensemble_training}'",
                             f"needs ensemble >= 2, got ensemble={self.ensemble}")
        return self

    @property
    def architecture(self) -> dict:
        """The architecture keys of its network kind, with their values."""
        return {key: getattr(self, key) for key in ARCHITECTURE_ARGS[self.model]}

    @property
    def dataset(self) -> DataSection:
        """The data set trained on: the `data` section, or the preset of `subset`."""
        return self.data if self.data is not None else preset(self.subset)

    @property
    def dataset_name(self) -> str:
        return self.dataset.name

    @property
    def n_conditions(self) -> int | None:
        """Operating conditions to scale by; None: found from the settings of the training
        units (a data set's `conditions: auto`)."""
        if self.condition_scaling == "global":
            return 1
        if self.condition_scaling == "per_condition" and self.data is None:
            return 6  # C-MAPSS's multi-condition subsets
        conditions = self.dataset.conditions
        return None if conditions == "auto" else conditions

    @property
    def data_limit(self) -> SizeLimit:
        """The size limit of the data files this config reads."""
        return SizeLimit(self.max_data_mb, DATA_LIMIT.knob)

    @property
    def experiment_name(self) -> str:
        return self.experiment or f"rul-{self.dataset_name.lower()}"

    def to_dict(self) -> dict[str, Any]:
        """The keys a YAML file would hold: B only when it is not micro x K, the keys of
        LEGACY_VALUES only when they differ from the value runs had before the key existed
        (so configs written before keep their form, params and identity), and `subset` only
        when no `data` section describes the data set; `split_seed` only when it differs from
        `seed` (runs before it split by their seed)."""
        values = self.model_dump()
        if self.split_seed == self.seed:
            del values["split_seed"]
        if self.data is not None:
            del values["subset"]
        if self.micro_batch_size != "auto" and (
                self.effective_batch_size == self.micro_batch_size * self.accumulation_steps):
            del values["effective_batch_size"]
        for key, legacy in LEGACY_VALUES.items():
            if values[key] == legacy:
                del values[key]
        return values

    def identity(self) -> dict[str, Any]:
        """What decides the trained model: the written keys less NOT_IN_IDENTITY (the same
        identity -> the same run, which is what `--resume` looks for)."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_IN_IDENTITY}

    def replace(self, **changes) -> "TrainConfig":
        """A re-validated copy with `changes` applied."""
        return validated(TrainConfig, with_legacy_values(self.to_dict()), changes)


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
    **dict.fromkeys(("ensemble", "ensemble_split", "ensemble_training"),
                    "members"),  # how many networks, and how they train
    **dict.fromkeys(("subset", "data", "split_seed"), "dataset"),  # which engines: every trial
    # of a study trains and validates on the same
    # refuses odd inputs or warns, refuses a larger file: what trains is the same
    **dict.fromkeys(("strict_data", "max_data_mb"), "checks"),
}
# Keys added after runs were first tracked, and the value every run had before: such a key is
# written (params, identity) only when it differs from it. Not the defaults, which move with
# the recipe. A network kind's new architecture key goes here too (tests/test_model_kinds.py).
LEGACY_VALUES = {"memory_budget": None, "ensemble": 1, "ensemble_split": "shared",
                 "ensemble_training": "auto", "include_cycle": False, "late_start_max": 0,
                 "strict_data": False, "max_data_mb": DATA_LIMIT.megabytes, "data": None,
                 "censored_training": "known",
                 "warmup_epochs": 0, "val_weights": "windows", "optimizer": "adamw",
                 "train_sampling": "windows"}


def with_legacy_values(written: dict) -> dict:
    """Keys as `to_dict` wrote them (a config's, a run's params), each key it left out back at
    its LEGACY_VALUES value, not at today's default (the split: by the seed)."""
    legacy = {**LEGACY_VALUES, "split_seed": written.get("seed", TrainConfig().seed)}
    return {**{k: v for k, v in legacy.items() if k not in written}, **written}


def keys_with(*roles: str) -> tuple[str, ...]:
    return tuple(key for key, role in KEY_ROLES.items() if role in roles)


# Not part of a run's identity: where things live, the machine, the calibration after training.
NOT_IN_IDENTITY = keys_with("place", "machine", "calibration", "checks")
# Keys a study may not vary: those, and what a trial always trains on (one network, one subset).
NOT_TUNABLE = keys_with("place", "machine", "calibration", "members", "dataset", "checks")
# Keys the invocations of one study may differ in: where and how fast a trial runs, not what
# it trains (e.g. fp16 on a GPU and fp32 on a CPU).
NOT_COMPARED_IN_A_STUDY = keys_with("place", "machine", "numerics", "calibration", "checks")

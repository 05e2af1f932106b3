"""A run's plan: every decision one training needs, made once, before anything trains or is
tracked.

`plan_run(config)` reads the config (and, for `--resume`, the checkpoint it continues) and
decides, each in exactly one place: the world (torchrun ranks), the device (and malloc's
settings on a CPU), the precision and the reason for it, the seeds, the prepared data (split,
preprocessing fitted on the training units, windows), the network, and the micro-batch x K
split (measured by the probe for `micro_batch_size: auto`). Nothing here knows MLflow:
training executes a plan (rul.training.run), a workflow wraps one in an MLflow run
(rul.workflows.tracked), and ensembles, `rul evaluate` and tuning build lists of plans
(plan_ensemble, plan_seeds).
Every check that can fail runs here, so a bad input fails before any run exists.
"""

from dataclasses import dataclass
from pathlib import Path

from rul.config import TrainConfig
from rul.data import Dataset, load_dataset
from rul.errors import ConfigError
from rul.evaluation.conformal import min_calibration_size
from rul.evaluation.truncation import TRAINING_DRAWS, window_weights
from rul.models.spec import NetworkSpec
from rul.preprocessing.prepared import PreparedData, prepare_data, prepare_members
from rul.training import checkpoint
from rul.training.distributed import World, current_world
from rul.training.hardware import keep_freed_memory
from rul.training.micro_batch import SplitChoice, probe_split
from rul.training.precision import Precision, resolve_device, resolve_precision
from rul.training.seeding import Seeds, derive_seeds
from rul.training.stacked import MemberTraining, member_training


@dataclass(frozen=True)
class ResumeTarget:
    """The checkpoint a run continues from, and the tracked run it belongs to (None for an
    untracked run)."""

    checkpoint: Path
    run_id: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """Everything one training needs, decided."""

    config: TrainConfig  # as trained: micro_batch_size and accumulation_steps are integers
    written: TrainConfig  # as written (`auto` stays auto): what the run's identity is made of
    world: World
    precision: Precision  # with its device and the reason it was chosen
    seeds: Seeds
    data: PreparedData
    network: NetworkSpec
    split: SplitChoice | None = None  # what `micro_batch_size: auto` measured and chose
    resume: dict | None = None  # the checkpoint's state to continue from
    resume_run_id: str | None = None  # the tracked run that checkpoint belongs to

    @property
    def device(self):
        return self.precision.device

    @property
    def val_weights(self):
        """Each validation window's weight in the validation RMSE (config.val_weights);
        None: every window once."""
        val = self.data.val
        return window_weights(self.config.val_weights, val.units, val.window, self.seeds.split)

    @property
    def train_sampling(self):
        """Each training window's probability in an epoch's draw (config.train_sampling);
        None: a shuffle, every window once."""
        train = self.data.train
        return window_weights(self.config.train_sampling, train.units, train.window,
                              self.seeds.split, TRAINING_DRAWS)

    @property
    def global_batch_size(self) -> int:
        """micro x K x world size: the samples of one optimizer step over all ranks."""
        return self.config.effective_batch_size * self.world.size


@dataclass(frozen=True)
class EnsemblePlan:
    """An ensemble: `config` (ensemble=N) and its members' plans, member i with seed + i."""

    config: TrainConfig
    members: list[RunPlan]
    training: MemberTraining  # stacked or one after another, and why


def plan_run(config: TrainConfig, resume: ResumeTarget | None = None,
             data: PreparedData | None = None, world: World | None = None,
             subset: Dataset | None = None) -> RunPlan:
    """The plan of one training of `config`: on `data` when it is already prepared (an
    ensemble's members share it), else on `subset` when its files are already read (the
    command line reads them before torch), in `world` (default: torchrun's, or a world of 1).
    Under torchrun every rank calls this: rank 0 reads the checkpoint and measures the split,
    the other ranks receive them."""
    world = world or current_world()
    device = resolve_device(config.device)
    if device.type == "cpu":
        keep_freed_memory()  # no page faults per step (rul.training.hardware)
    state = _resume_state(resume, world)
    precision = resolve_precision(config.precision, device, config.model,
                                  resumed=(state or {}).get("precision"))
    seeds = derive_seeds(config.seed)
    if data is None:
        data = prepare_data(config, seeds.split, subset)
        check_calibration(config, [data])
    network = NetworkSpec.of(config, data.preprocessor.n_features)
    trained, split = _micro_batch_split(config, network, data, precision, world)
    return RunPlan(trained, config, world, precision, seeds, data, network, split, state,
                   resume.run_id if resume else None)


def plan_ensemble(config: TrainConfig, subset: Dataset | None = None, jobs: int = 1
                  ) -> EnsemblePlan:
    """The plans of config.ensemble members: member i trains `config` with seed + i (its
    weight init, dropout and batch order), on the validation split of `seed` (shared) or on
    fold i of seed's permutation (folds); never registered or resumed on its own. They train
    `jobs` at a time, or stacked (rul.training.stacked.member_training decides)."""
    data = prepare_members(config, derive_seeds(config.seed).split, subset)
    check_calibration(config, data)
    members = [plan_run(config.replace(seed=config.seed + i, ensemble=1,
                                       ensemble_split="shared", ensemble_training="auto",
                                       register=False), data=d)
               for i, d in enumerate(data)]
    return EnsemblePlan(config, members,
                        member_training(config.ensemble_training, members, jobs))


def evaluation_seeds(config: TrainConfig, n: int) -> list[int]:
    """The seeds of `rul evaluate --seeds n`: seed, seed + E, seed + 2E, ... for an ensemble
    of E members, so that no member's seed repeats."""
    return [config.seed + i * config.ensemble for i in range(n)]


def plan_seeds(config: TrainConfig, n: int) -> list[RunPlan | EnsemblePlan]:
    """`rul evaluate`: one complete training of `config` per seed (an ensemble for ensemble >
    1), each with its own validation split; nothing registered. Every seed's data is
    prepared and checked before the first run; the files are read once."""
    subset = load_dataset(config.dataset, config.data_dir, limit=config.data_limit)
    plans = []
    for seed in evaluation_seeds(config, n):
        seeded = config.replace(seed=seed, register=False)
        if config.ensemble > 1:
            plans.append(plan_ensemble(seeded, subset))
        else:
            data = prepare_data(seeded, derive_seeds(seed).split, subset)
            check_calibration(seeded, [data])
            plans.append(plan_run(seeded, data=data))
    return plans


def check_calibration(config: TrainConfig, data: list[PreparedData]) -> None:
    """The validation windows of `data` (one split, shared, or an ensemble's folds) must be
    enough to calibrate the interval: ConfigError otherwise."""
    if config.interval_coverage is None:
        return
    needed = min_calibration_size(config.interval_coverage)
    distinct = {id(d): d for d in data}.values()
    windows = sum(len(d.val) for d in distinct)
    if windows < needed:
        folds = len(distinct) > 1
        raise ConfigError(f"interval_coverage={config.interval_coverage}: needs at least "
                          f"{needed} validation windows to calibrate, the validation units "
                          f"give {windows} (lower it"
                          f"{'' if folds else ', or raise val_fraction'})")


def _resume_state(resume: ResumeTarget | None, world: World) -> dict | None:
    """The checkpoint to continue from: read by rank 0 onto the CPU (whatever device the run
    trains on: checkpoint.load), the same on every rank."""
    state = checkpoint.load(resume.checkpoint) if resume and world.is_main else None
    return world.broadcast(state)


def _micro_batch_split(config: TrainConfig, network: NetworkSpec, data: PreparedData,
                       precision: Precision, world: World
                       ) -> tuple[TrainConfig, SplitChoice | None]:
    """Integers stay as written; `auto` is measured by rank 0 (rul.training.micro_batch) and
    every rank trains with its choice."""
    if config.micro_batch_size != "auto":
        return config, None
    split = chosen = None
    if world.is_main:
        try:
            split = probe_split(config, network, data.train, precision)
            chosen = (split.micro_batch_size, split.accumulation_steps)
        except ConfigError as error:  # nothing fits: every rank stops with the same line
            chosen = error
    chosen = world.broadcast(chosen)
    if isinstance(chosen, ConfigError):
        raise chosen
    micro, k = chosen
    return config.replace(micro_batch_size=micro, accumulation_steps=k,
                          effective_batch_size=config.effective_batch_size), split

"""A run's plan: every decision one training needs, made once, before anything trains or is
tracked.

`plan_run(config)` reads the config (and, for `--resume`, the checkpoint it continues) and
decides, each in exactly one place: the world (torchrun ranks), the device (and malloc's
settings on a CPU), the precision and the reason for it, the seeds, the prepared data (split,
preprocessing fitted on the training units, windows), the network, and the micro-batch x K
split (measured by the probe for `micro_batch_size: auto`). It also narrows the config into
the frozen settings each layer below reads (DataSettings, NetworkSpec, OptimizerSettings,
LoopSettings, StepSettings): nothing below the plan reads the config. Nothing here knows MLflow:
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
from rul.models.spec import NetworkSpec
from rul.preprocessing.features import candidate_columns
from rul.preprocessing.prepared import PreparedData, prepare_data, prepare_folds
from rul.preprocessing.settings import DataSettings
from rul.training import checkpoint, cpu_probe
from rul.training.distributed import World, current_world
from rul.training.hardware import keep_freed_memory
from rul.training.micro_batch import SplitChoice, probe_split
from rul.training.precision import Precision, resolve_device, resolve_precision
from rul.training.seeding import Seeds, derive_seeds
from rul.training.settings import LoopSettings, OptimizerSettings, StepRecipe, TrainingPlan
from rul.training.stacked import MemberTraining, member_training
from rul.training.step import StepSettings


@dataclass(frozen=True)
class ResumeTarget:
    """The checkpoint a run continues from, and the tracked run it belongs to (None for an
    untracked run)."""

    checkpoint: Path
    run_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunPlan(TrainingPlan):
    """Everything one training needs, decided (TrainingPlan: what the training layer reads),
    and the config it was decided from, for tracking."""

    config: TrainConfig  # as trained: micro_batch_size and accumulation_steps are integers
    written: TrainConfig  # as written (`auto` stays auto): what the run's identity is made of
    split: SplitChoice | None = None  # what `micro_batch_size: auto` measured and chose
    resume_run_id: str | None = None  # the tracked run that checkpoint belongs to

    @classmethod
    def of(cls, config: TrainConfig, precision: Precision, seeds: Seeds, data: PreparedData,
           **decided) -> "RunPlan":
        """The plan of `config` with what was decided for it (`decided`: world, network,
        written, split, resume, resume_run_id; by default a world of 1, the config's network
        for the data's inputs, `config` as written)."""
        world = decided.pop("world", None) or World()
        network = decided.pop("network", None) or network_of(config,
                                                              data.train.values.shape[1])
        return cls(config=config, written=decided.pop("written", config), world=world,
                   precision=precision, seeds=seeds, data=data, network=network,
                   optimization=optimizer_settings(config, precision),
                   loop=loop_settings(config),
                   step=step_settings(config, precision, world.size),
                   interval_coverage=config.interval_coverage, **decided)


def network_of(config: TrainConfig, n_features: int) -> NetworkSpec:
    """The network `config` describes, for `n_features` inputs."""
    return NetworkSpec(config.model, n_features, config.window, config.rul_cap,
                       config.architecture)


def step_settings(config: TrainConfig, precision: Precision, world_size: int = 1
                  ) -> StepSettings:
    return StepSettings(precision, config.max_grad_norm, config.rul_cap, world_size)


def optimizer_settings(config: TrainConfig, precision: Precision | None = None
                       ) -> OptimizerSettings:
    """`config`'s optimizer, for gradients computed in `precision` (default: fp32)."""
    return OptimizerSettings(config.optimizer, config.lr, config.weight_decay, config.scheduler,
                             config.warmup_epochs, config.epochs, config.ema_decay,
                             precision.name if precision else "fp32")


def loop_settings(config: TrainConfig) -> LoopSettings:
    return LoopSettings(config.epochs, config.patience, config.effective_batch_size,
                        config.micro_batch_size, config.memory_budget, config.train_sampling,
                        config.val_weights, config.deterministic)


def recipe_step(config: TrainConfig | None = None) -> StepRecipe:
    """One optimizer step of `config` (default: `make train`'s recipe, TrainConfig's own
    defaults) on C-MAPSS's inputs: what the precision probe and the benches time."""
    config = config or TrainConfig()
    inputs = len(candidate_columns(config.features, config.include_settings,
                                   config.include_cycle))
    micro = config.micro_batch_size if config.micro_batch_size != "auto" else \
        config.effective_batch_size
    return StepRecipe(network_of(config, inputs), optimizer_settings(config),
                      config.effective_batch_size, micro, config.max_grad_norm)


def cpu_measured() -> cpu_probe.Measured:
    """`make train`'s step timed in fp32 and bf16 on this CPU, once per machine and recipe:
    what `precision: auto` reads on a CPU with native bf16."""
    return cpu_probe.measured(recipe_step())


def data_settings(config: TrainConfig) -> DataSettings:
    """What preparing `config`'s data reads (rul.preprocessing.prepared)."""
    return DataSettings(
        config.dataset, config.data is not None, config.data_dir, config.data_limit,
        config.val_fraction, config.late_start_max, config.censored_training, config.window,
        config.rul_cap, config.features, config.include_settings, config.include_cycle,
        config.drop_constant, config.normalization, config.smoothing_alpha, config.n_conditions,
        config.strict_data, config.seed)


def prepared(config: TrainConfig, split_seed: int, subset: Dataset | None = None
             ) -> PreparedData:
    """`config`'s data on the validation split of `split_seed` (rul.preprocessing.prepared);
    `subset`: its files when already read."""
    return prepare_data(data_settings(config), split_seed, subset)


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
    state = _resume_state(resume, world, config.epochs)
    precision = resolve_precision(config.precision, device, config.model,
                                  resumed=(state or {}).get("precision"), probe=cpu_measured)
    seeds = derive_seeds(config.seed, config.split_seed)
    if data is None:
        data = prepared(config, seeds.split, subset)
        check_calibration(config, [data])
    network = network_of(config, data.preprocessor.n_features)
    trained, split = _micro_batch_split(config, network, data, precision, world)
    return RunPlan.of(trained, precision, seeds, data, world=world, network=network,
                      written=config, split=split, resume=state,
                      resume_run_id=resume.run_id if resume else None)


def plan_ensemble(config: TrainConfig, subset: Dataset | None = None, jobs: int = 1
                  ) -> EnsemblePlan:
    """The plans of config.ensemble members: member i trains `config` with seed + i (its
    weight init, dropout, batch order and draws), on the validation split of `split_seed`
    (shared) or on fold i of its permutation (folds); never registered or resumed on its own.
    They train `jobs` at a time, or stacked (rul.training.stacked.member_training decides)."""
    split_seed = derive_seeds(config.split_seed).split
    if config.ensemble_split == "folds":
        data = prepare_folds(data_settings(config), config.ensemble, split_seed, subset)
    else:
        data = [prepared(config, split_seed, subset)] * config.ensemble
    check_calibration(config, data)
    members = [plan_run(config.replace(seed=config.seed + i, split_seed=config.seed + i,
                                       ensemble=1, ensemble_split="shared",
                                       ensemble_training="auto", register=False), data=d)
               for i, d in enumerate(data)]
    return EnsemblePlan(config, members,
                        member_training(config.ensemble_training, members, jobs))


def evaluation_seeds(config: TrainConfig, n: int) -> list[int]:
    """The seeds of `rul evaluate --seeds n`: seed, seed + E, seed + 2E, ... for an ensemble
    of E members, so that no member's seed repeats."""
    return [config.seed + i * config.ensemble for i in range(n)]


def plan_seeds(config: TrainConfig, n: int) -> list[RunPlan | EnsemblePlan]:
    """`rul evaluate`: one complete training of `config` per seed (an ensemble for ensemble >
    1), each with its own validation split (split_seed = seed: the spread over splits is what
    an evaluation measures); nothing registered. Every seed's data is prepared and checked
    before the first run; the files are read once."""
    subset = load_dataset(config.dataset, config.data_dir, limit=config.data_limit)
    plans = []
    for seed in evaluation_seeds(config, n):
        seeded = config.replace(seed=seed, split_seed=seed, register=False)
        if config.ensemble > 1:
            plans.append(plan_ensemble(seeded, subset))
        else:
            data = prepared(seeded, derive_seeds(seed).split, subset)
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


def _resume_state(resume: ResumeTarget | None, world: World, epochs: int) -> dict | None:
    """The checkpoint to continue from: read by rank 0 onto the CPU (whatever device the run
    trains on: checkpoint.load), its plain data checked against a run of `epochs` epochs, the
    same on every rank."""
    state = checkpoint.load(resume.checkpoint, epochs) if resume and world.is_main else None
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
            split = probe_split(loop_settings(config), network,
                                optimizer_settings(config, precision),
                                step_settings(config, precision), data.train)
            chosen = (split.micro_batch_size, split.accumulation_steps)
        except ConfigError as error:  # nothing fits: every rank stops with the same line
            chosen = error
    chosen = world.broadcast(chosen)
    if isinstance(chosen, ConfigError):
        raise chosen
    micro, k = chosen
    return config.replace(micro_batch_size=micro, accumulation_steps=k,
                          effective_batch_size=config.effective_batch_size), split

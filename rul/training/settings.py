"""What one training computes with, decided by the plan (rul.plan) from the config and held
as frozen plain values: the training layer reads these, never the config."""

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np
import torch

from rul.evaluation.truncation import TRAINING_DRAWS, window_weights
from rul.models.spec import NetworkSpec
from rul.preprocessing.prepared import PreparedData
from rul.training.distributed import World
from rul.training.precision import Precision
from rul.training.seeding import Seeds
from rul.training.step import StepSettings


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer (a row of rul.training.optimizers.OPTIMIZER_KINDS), its schedule over
    `epochs` and the weight average."""

    kind: str
    lr: float
    weight_decay: float
    scheduler: str  # none | cosine | onecycle
    warmup_epochs: int
    epochs: int
    ema_decay: float  # 0: no weight average
    precision: str = "fp32"  # the gradients' arithmetic (Muon's floor: rul.training.muon)


@dataclass(frozen=True)
class LoopSettings:
    """The epoch loop's: how long, how each epoch draws its batches and scores validation,
    and the effective batch's split."""

    epochs: int
    patience: int
    effective_batch_size: int
    micro_batch_size: int | str  # an integer once planned (`auto` before the probe)
    memory_budget: int | None  # bytes for `micro_batch_size: auto`; None: the device's default
    train_sampling: str  # windows | truncation (rul.evaluation.truncation)
    val_weights: str  # windows | truncation
    deterministic: bool


@dataclass(frozen=True, kw_only=True)
class TrainingPlan:
    """Everything one training reads, decided: rul.plan.RunPlan adds the config it came from."""

    world: World
    precision: Precision  # with its device and the reason it was chosen
    seeds: Seeds
    data: PreparedData
    network: NetworkSpec
    optimization: OptimizerSettings
    loop: LoopSettings
    step: StepSettings
    interval_coverage: float | None  # None: no prediction interval
    resume: dict | None = None  # the checkpoint's state to continue from

    @property
    def device(self):
        return self.precision.device

    @property
    def val_weights(self) -> np.ndarray | None:
        """Each validation window's weight in the validation RMSE; None: every window once."""
        val = self.data.val
        return window_weights(self.loop.val_weights, val.units, val.window, self.seeds.split)

    @property
    def train_sampling(self) -> np.ndarray | None:
        """Each training window's probability in an epoch's draw; None: a shuffle, every
        window once."""
        train = self.data.train
        return window_weights(self.loop.train_sampling, train.units, train.window,
                              self.seeds.split, TRAINING_DRAWS)

    @property
    def global_batch_size(self) -> int:
        """micro x K x world size: the samples of one optimizer step over all ranks."""
        return self.loop.effective_batch_size * self.world.size


@dataclass(frozen=True)
class StepRecipe:
    """One optimizer step of a recipe as the precision probe and the benches time it: its
    network, optimizer, effective batch and split, and clipping (rul.plan.recipe_step makes
    `make train`'s, from its one home)."""

    network: NetworkSpec
    optimization: OptimizerSettings
    effective_batch_size: int
    micro_batch_size: int
    max_grad_norm: float | None

    def settings(self, precision: Precision) -> StepSettings:
        return StepSettings(precision, self.max_grad_norm, self.network.rul_cap)

    def optimizer(self, precision: Precision) -> OptimizerSettings:
        """The optimizer as training builds it for gradients computed in `precision` (Muon's
        half-precision floor with it)."""
        return dataclasses.replace(self.optimization, precision=precision.name)

    def micro_batches(self, device=None, batch: int | None = None) -> list:
        """An effective batch of random windows of the network's shape, split as the recipe
        splits it (`batch`: fewer samples, split alike), drawn from a generator of its own."""
        batch = batch or self.effective_batch_size
        micro = max(1, batch * self.micro_batch_size // self.effective_batch_size)
        generator = torch.Generator().manual_seed(0)
        net = self.network
        x = torch.randn(batch, net.window, net.n_features, generator=generator)
        y = torch.rand(batch, generator=generator) * net.rul_cap
        return list(zip(x.to(device).split(micro), y.to(device).split(micro), strict=True))

    def key(self) -> str:
        """A short digest of everything the step computes: a cached figure of another recipe
        is not this one's."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

"""What every loop of `bench peers` shares, so that only the loop differs: the config, the
prepared windows, the network (built from the same seed), the precision, the micro-batch
stream and the loss; and how a loop's time and result are measured.

Built from rul's own decisions (rul.preprocessing.prepared, rul.models.spec,
rul.training.precision, rul.training.batching), not from `plan_run`: the plan also sets
glibc's malloc for `rul train` (rul.training.hardware.keep_freed_memory), which only rul's
loop gets (bench/peers/rul_loop.py), as `rul train` does.
"""

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "experiments" / "fd001.yaml"
TINY = {"filters": 4, "num_layers": 2, "hidden_size": 16}  # the dry run's network
DRY_UNITS = 10  # the dry run trains on FD001's first 10 training engines


def bench_config(epochs: int, dry: bool, device: str):
    """`make train`'s recipe (its DCNN, 256 x 2, its optimizer and schedule, clipping, the
    precision `auto` picks) for `epochs` epochs, without early stopping and without the weight
    average (none of the peers has rul's warm-up EMA built in: every loop validates and
    returns its last weights)."""
    from rul import config as cfg

    changes = {"epochs": epochs, "patience": epochs + 1, "ema_decay": 0.0, "device": device,
               "interval_coverage": None, "register": False}
    return cfg.load(RECIPE, {**changes, **(TINY if dry else {})})


class Baton:
    """Whose turn it is: each loop's process trains one epoch (its validation included) per
    turn, the others waiting, so that a busy machine slows every loop alike (bench/peers/
    runner.py deals the turns). A loop takes a turn before its setup and before each epoch
    but the first; the seconds it waits are not its time. Without a connection (one loop
    alone) every turn is at once."""

    def __init__(self, conn=None):
        self.conn, self.waited = conn, 0.0

    def turn(self) -> None:
        if self.conn is None:
            return
        started = time.perf_counter()
        self.conn.send(("turn", None))
        self.conn.recv()
        self.waited += time.perf_counter() - started


@dataclass
class Setup:
    """One loop's inputs, identical in every loop's process."""

    config: object  # rul.config.TrainConfig
    seeds: object  # rul.training.seeding.Seeds
    data: object  # rul.preprocessing.prepared.PreparedData
    network: object  # rul.models.spec.NetworkSpec
    precision: object  # rul.training.precision.Precision
    baton: Baton = field(default_factory=Baton)

    def start(self) -> tuple[float, float]:
        """Now, for `seconds_since`: the time, and the seconds waited for turns so far."""
        return time.perf_counter(), self.baton.waited

    def seconds_since(self, started: tuple[float, float]) -> float:
        """Seconds since `started` (`start()`) less those spent waiting for a turn since."""
        synchronize(self.device)
        at, waited = started
        return time.perf_counter() - at - (self.baton.waited - waited)

    @classmethod
    def of(cls, epochs: int, dry: bool, baton: Baton | None = None) -> "Setup":
        from rul.data import load_subset
        from rul.plan import cpu_measured, network_of, prepared
        from rul.training.precision import resolve_device, resolve_precision
        from rul.training.seeding import derive_seeds

        device = "cuda" if torch.cuda.is_available() else "cpu"
        config = bench_config(epochs, dry, device)
        seeds = derive_seeds(config.seed)
        subset = load_subset("FD001", os.environ.get("CMAPSS_DIR"))
        if dry:
            subset = dataclasses.replace(subset,
                                         train=subset.train[subset.train["unit"] <= DRY_UNITS])
        data = prepared(config, seeds.split, subset)
        precision = resolve_precision(config.precision, resolve_device(config.device),
                                      config.model, probe=cpu_measured)
        return cls(config, seeds, data, network_of(config, data.preprocessor.n_features),
                   precision, baton or Baton())

    @property
    def device(self) -> torch.device:
        return self.precision.device

    def model(self) -> nn.Module:
        """The network, initialised as `rul train` initialises it (same seeds, same draws)."""
        from rul.training.seeding import seed_everything

        seed_everything(self.seeds, self.config.deterministic)
        return self.network.build().to(self.device)

    def batches(self, split: str):
        from rul.training.batching import WindowBatches

        return WindowBatches(getattr(self.data, split), self.device)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """rul's loss (rul.training.step): the MSE of RUL / rul_cap, in float32."""
        cap = self.config.rul_cap
        return nn.functional.mse_loss(model(x).float() / cap, y / cap)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The recipe's optimizer (Muon for the matrices with AdamW for the rest, in
        make train's) as rul builds it on the host, the same in every loop: only the loop
        differs."""
        from rul.plan import optimizer_settings
        from rul.training.optim import make_optimizer

        return make_optimizer(model, optimizer_settings(self.config), sync_free=False)

    def schedule(self, optimizer):
        """torch's cosine decay over all optimizer steps, as rul's (rul.training.optim)."""
        from rul.plan import optimizer_settings
        from rul.training.optim import make_scheduler

        return make_scheduler(optimizer, optimizer_settings(self.config),
                              self.config.epochs * self.steps_per_epoch)

    @property
    def steps_per_epoch(self) -> int:
        from rul.training.optim import steps_per_epoch

        return steps_per_epoch(len(self.data.train), self.config.effective_batch_size)

    def effective_batches(self, epoch: int) -> list[list[torch.Tensor]]:
        """Epoch `epoch`'s effective batches as rul draws them (rul.training.batching, from
        the recipe's law: train_sampling), each as its micro-batches' indices: every loop sees
        the same windows in the same order."""
        from rul.plan import RunPlan
        from rul.training.batching import effective_batches

        config = self.config
        law = RunPlan.of(config, self.precision, self.seeds, self.data).train_sampling
        windows = len(self.data.train) if law is None else torch.from_numpy(law)
        return [list(batch.split(config.micro_batch_size))
                for batch in effective_batches(windows, config.effective_batch_size,
                                               self.seeds.shuffle, epoch)]


class MicroBatches(torch.utils.data.Dataset):
    """The micro-batches of one epoch as a map-style dataset (item i: micro-batch i's windows
    and targets), for the frameworks' DataLoaders (`batch_size=None`: each item is a batch).
    `set_epoch` draws the epoch's order; a framework's loop calls it at each epoch's start."""

    def __init__(self, setup: Setup):
        self.setup, self.windows = setup, setup.batches("train")
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.indices = [m for batch in self.setup.effective_batches(epoch) for m in batch]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.windows.get(self.indices[i])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class EpochClock:
    """Each epoch's training seconds (validation excluded), read on the host after the device
    finished: `start()` before an epoch's first batch, `stop()` after its last step."""

    device: torch.device
    seconds: list[float] = field(default_factory=list)
    _started: float | None = None

    def start(self) -> None:
        synchronize(self.device)
        self._started = time.perf_counter()

    def stop(self) -> None:
        synchronize(self.device)
        self.seconds.append(time.perf_counter() - self._started)


def samples_per_second(epoch_seconds: list[float], per_epoch: int) -> float:
    """Training samples per second in the steady state: over every epoch but the first (its
    one-time work: allocations, a framework's setup, CUDA graphs' capture), or the first
    when there is only one."""
    timed = epoch_seconds[1:] or epoch_seconds
    return per_epoch * len(timed) / sum(timed)


def last_val_rmse(setup: Setup, model: nn.Module) -> float:
    """The validation RMSE of the weights a loop ends with, as rul's epochs compute it
    (rul.training.predict.validation_rmse): the same function for every loop."""
    from rul.training.predict import validation_rmse

    model.to(setup.device)  # Lightning's Trainer hands a GPU-trained module back on the CPU
    return validation_rmse(model, setup.batches("val"))


def measured(setup: Setup, wall: float, epoch_seconds: list[float], val_rmse: float) -> dict:
    """A loop's result: wall time, steady samples/s, and the validation RMSE it reaches."""
    return {"wall_s": wall, "epoch_s": epoch_seconds,
            "samples_per_s": samples_per_second(epoch_seconds, len(setup.data.train)),
            "val_rmse": val_rmse,
            "epochs": len(epoch_seconds), "windows": len(setup.data.train),
            "precision": setup.precision.name, "device": str(setup.device),
            "optimizer": setup.config.optimizer}

"""The epoch loop: effective batches -> optimizer_step, validation, early stopping, checkpoints.

The pieces it drives each have a module of their own: the step (step.py), the batches
(batching.py), the optimizer and schedule (optim.py), the weight average (weight_average.py),
what follows a step that decided on the GPU (sync_free.py) and its CUDA graph
(cuda_graph.py), early stopping (early_stopping.py), checkpoints (checkpoint.py) and what the
outside world hears (listener.py).
"""

import math
import time
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from rul.training import checkpoint, cuda_graph
from rul.training.backoff import BackoffStep
from rul.training.batching import WindowBatches, effective_batches
from rul.training.distributed import World, collectives, epoch_seed, global_batch_size
from rul.training.early_stopping import EarlyStopping
from rul.training.listener import TrainingListener
from rul.training.optim import (
    decides_on_device,
    load_optimizer_state,
    make_optimizer,
    make_scheduler,
    steps_per_epoch,
)
from rul.training.peak_memory import peak_memory_mb
from rul.training.predict import validation_rmse
from rul.training.step import StepResult
from rul.training.sync_free import DeviceSchedule, StepLog, average_on_device
from rul.training.weight_average import weight_average


@dataclass
class TrainState:
    """Progress that a checkpoint must carry to continue a run exactly."""

    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps attempted (skipped ones included)
    skipped_steps: int = 0
    best_val_rmse: float = math.inf
    best_epoch: int = 0  # 1-based; 0 = none yet
    bad_epochs: int = 0
    best_weights: dict | None = None
    history: list = field(default_factory=list)  # one dict of epoch metrics per epoch
    grad_norms: list = field(default_factory=list)  # unscaled, one per optimizer step

    def record_step(self, result: StepResult) -> None:
        self.step += 1
        self.skipped_steps += result.skipped
        self.grad_norms.append(result.grad_norm)


class TrainingParts:
    """What changes while training, and what a checkpoint restores: the model, its optimizer,
    GradScaler, schedule and weight average.

    On a CPU the step's skip decision is read on the host and the scheduler and weight
    average follow it there. With a sync-free optimizer (CUDA: optim.make_optimizer) they
    follow it on the device (sync_free.py) and the host scheduler is brought up to date once
    per epoch (`end_epoch`), so a checkpoint holds the same state either way."""

    def __init__(self, model, config, precision, total_steps: int):
        self.model = model
        self.precision = precision.name  # saved: a resumed run keeps it (resolve_precision)
        self.optimizer = make_optimizer(model, config)
        self.on_device = decides_on_device(self.optimizer)
        self.scaler = precision.grad_scaler()
        self.schedule = None
        if self.on_device and config.scheduler != "none":
            self.schedule = DeviceSchedule(
                self.optimizer, lambda host: make_scheduler(host, config, total_steps),
                total_steps, config.lr)
            self.scheduler = self.schedule.scheduler
        else:
            self.scheduler = make_scheduler(self.optimizer, config, total_steps)
        self.average = weight_average(model, config.ema_decay)
        self.decay = config.ema_decay

    @property
    def evaluated(self):
        """What validation and the returned model use: the weight average when there is one."""
        return self.average.module if self.average is not None else self.model

    def after_step(self, result: StepResult) -> None:
        """Schedule and weight average move only when the optimizer really stepped."""
        if self.on_device:
            if self.schedule is not None:
                self.schedule.after_step(result.skipped)
            if self.average is not None:
                average_on_device(self.average, self.model, result.skipped, self.decay)
        elif not result.skipped:
            if self.scheduler is not None:
                self.scheduler.step()
            if self.average is not None:
                self.average.update_parameters(self.model)

    def end_epoch(self) -> None:
        if self.schedule is not None:
            self.schedule.sync()

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "precision": self.precision, "scaler": self.scaler.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                "ema": self.average.state_dict() if self.average is not None else None}

    def load_state_dict(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])
        load_optimizer_state(self.optimizer, saved["optimizer"])
        self.scaler.load_state_dict(saved["scaler"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(saved["scheduler"])
        if self.schedule is not None:
            self.schedule.loaded()
        if self.average is not None:
            self.average.load_state_dict(saved["ema"])


def fit(model, config, precision, seeds, train: WindowBatches, val: WindowBatches,
        listener: TrainingListener | None = None, checkpointer=None,
        resume_from: dict | None = None, progress: bool = True,
        world: World | None = None) -> TrainState:
    """Train with early stopping on validation RMSE; return the state with best weights loaded.

    `world` of N > 1 (torchrun): DDP, each rank its share of every effective batch of
    micro x K x N samples; see distributed.py for what is shared and how.
    On CUDA the loop never waits for the GPU inside an epoch: each step's record stays on
    the device and is read once at the epoch's end, with validation (`StepLog`); a run of
    one process replays each step from a CUDA graph (cuda_graph.py)."""
    listener, world = listener or TrainingListener(), world or World()
    batch_size = config.effective_batch_size * world.size
    per_epoch = steps_per_epoch(len(train), batch_size)
    parts = TrainingParts(model, config, precision, config.epochs * per_epoch)
    stopping = EarlyStopping(config.patience)
    step = BackoffStep(config.micro_batch_size, config.effective_batch_size)  # halves on OOM
    state = TrainState()
    if resume_from is not None:
        parts.load_state_dict(resume_from)
        state = resume_from["train_state"]
        if not world.distributed:  # N ranks re-seed per epoch instead (distributed.py)
            checkpoint.restore_rng_state(resume_from["rng"])
    trained = world.wrap(model)  # DDP broadcasts rank 0's weights: identical on every rank
    device = train.starts.device

    def train_step(indices: torch.Tensor, total: int, attempt=step) -> StepResult:
        result = attempt(trained, parts.optimizer, parts.scaler, train, indices, precision,
                         config.max_grad_norm, config.rul_cap, global_total=total,
                         world_size=world.size)
        parts.after_step(result)
        return result

    def eager_step(indices: torch.Tensor) -> torch.Tensor:
        return train_step(indices, len(indices)).packed(device)

    def captured_step(indices: torch.Tensor) -> torch.Tensor:  # no back-off, no host read
        return train_step(indices, len(indices), step.attempt).packed(device)

    graphed = None  # one process on CUDA: each batch size replays its captured step
    if (parts.on_device and device.type == "cuda" and not world.distributed
            and cuda_graph.ENABLED):
        graphed = cuda_graph.GraphedStep(eager_step, captured_step, device)

    while state.epoch < config.epochs and not stopping.should_stop(state):
        model.train()
        if world.distributed:
            torch.manual_seed(epoch_seed(seeds.torch, world.rank, state.epoch))
        started, sizes, losses, log = time.perf_counter(), [], [], StepLog()
        batches = effective_batches(len(train), config.effective_batch_size, 1, seeds.shuffle,
                                    state.epoch, world.size, world.rank, device)
        bar = _progress_bar(batches, per_epoch, state, config.epochs, progress)
        for in_epoch, (indices,) in enumerate(bar):  # `step` splits each batch
            sizes.append(global_batch_size(len(train), batch_size, in_epoch))
            with collectives():
                if graphed is not None:
                    log.rows.append(graphed(indices))
                elif parts.on_device:
                    log.add(train_step(indices, sizes[-1]), device)
                else:  # a CPU: the values are on the host already
                    result = train_step(indices, sizes[-1])
                    result.loss = world.average(result.loss)  # the global sample-weighted loss
                    _record(state, listener, result)
                    losses.append(result.loss)
                    bar.set_postfix(loss=f"{result.loss:.4f}", grad=f"{result.grad_norm:.2f}",
                                    refresh=False)
        if parts.on_device:  # the epoch's records: one read (and one all-reduce under DDP)
            results = log.read()
            for result, loss in zip(results, world.average_all([r.loss for r in results]),
                                    strict=True):
                result.loss = loss
                _record(state, listener, result)
                losses.append(loss)
        parts.end_epoch()
        train_seconds = time.perf_counter() - started
        val_rmse = validation_rmse(parts.evaluated, val)
        val_rmse = world.broadcast(val_rmse)  # rank 0's: every rank stops at the same epoch
        state.epoch += 1
        stopping.update(state, val_rmse, parts.evaluated)
        seen = sum(sizes)
        loss_sum = sum(loss * n for loss, n in zip(losses, sizes, strict=True))
        metrics = {"train_loss_epoch": loss_sum / max(seen, 1), "val_rmse": val_rmse,
                   "samples_per_s": seen / train_seconds,
                   "peak_memory_mb": peak_memory_mb(precision.device),
                   "micro_batch_size": step.micro_batch_size,  # smaller after an OOM back-off
                   "accumulation_steps": step.accumulation_steps}
        state.history.append(metrics)
        if progress:
            _print_epoch(state, metrics)
        if checkpointer is not None:
            checkpointer.save(parts, state)
        listener.on_epoch(state.epoch, state.step, metrics)

    stopping.restore_best(model, state)
    return state


def _record(state: TrainState, listener: TrainingListener, result: StepResult) -> None:
    state.record_step(result)
    listener.on_step(state.step, result)


def _progress_bar(batches, total: int, state: TrainState, epochs: int, progress: bool):
    last = f"  last val RMSE {state.history[-1]['val_rmse']:.2f}" if state.history else ""
    return tqdm(batches, total=total, disable=not progress, leave=False, unit="step",
                desc=f"epoch {state.epoch + 1}/{epochs}{last}")


def _print_epoch(state: TrainState, metrics: dict) -> None:
    tqdm.write(f"epoch {state.epoch:3d}  train_loss {metrics['train_loss_epoch']:.5f}  "
               f"val_rmse {metrics['val_rmse']:6.2f}  best {state.best_val_rmse:6.2f}"
               f"@{state.best_epoch}  {metrics['samples_per_s']:,.0f} samples/s")

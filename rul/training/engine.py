"""The epoch loop of a plan (rul.plan.RunPlan): effective batches -> the step, validation,
early stopping, checkpoints.

What it drives lives beside it: the step (step.py, its out-of-memory back-off backoff.py), the
batches (batching.py), the optimizer, schedule and weight average (optim.py), a step decided on
the GPU (sync_free.py, cuda_graph.py), checkpoints (checkpoint.py) and the listener
(listener.py) (docs: Concepts, The training step).
"""

import time
from functools import partial

import torch

from rul.training import checkpoint, cuda_graph
from rul.training.backoff import BackoffStep
from rul.training.batching import WindowBatches
from rul.training.distributed import collectives, epoch_seed, global_batch_size
from rul.training.listener import TrainingListener
from rul.training.members import Members
from rul.training.optim import TrainingParts, steps_per_epoch
from rul.training.peak_memory import peak_memory_mb
from rul.training.predict import validation_rmse
from rul.training.settings import TrainingPlan
from rul.training.state import TrainState
from rul.training.step import StepResult
from rul.training.sync_free import StepLog


def fit(model, plan: TrainingPlan, listener: TrainingListener | None = None,
        checkpointer=None, progress: bool = True) -> TrainState:
    """Train `model` as `plan` says (its settings, precision, seeds, data, world and the
    checkpoint it resumes) with early stopping on validation RMSE; return the state, the best
    weights loaded. A world of N > 1 (torchrun) trains with DDP, each rank its share of every
    effective batch (distributed.py); on CUDA the loop never waits for the GPU inside an epoch
    (`StepLog`, cuda_graph.py)."""
    parts = TrainingParts(model, plan.optimization, plan.precision, _total_steps(plan))
    members = Members([plan], [listener], [_resumed(parts, plan)])
    _train(parts, plan, members, checkpointer, progress)
    members.state.restore_best(model)
    return members.state


def fit_members(stacked, plans: list[TrainingPlan], listeners: list | None = None,
                progress: bool = False) -> list[TrainState]:
    """Train an ensemble's members at once, `stacked` into one network (StackedNetwork), each
    `plans[i]` with its own batch order, early stopping and listener, by the same loop and step
    as one run; return their states (best weights: state.best_weights; the stack: the last)."""
    plan = plans[0]
    parts = TrainingParts(stacked, plan.optimization, plan.precision, _total_steps(plan))
    members = Members(plans, listeners or [None] * len(plans), [TrainState() for _ in plans])
    _train(parts, plan, members, None, progress)
    return members.states


def _total_steps(plan: TrainingPlan) -> int:
    return plan.loop.epochs * steps_per_epoch(len(plan.data.train), plan.global_batch_size)


def _train(parts: TrainingParts, plan: TrainingPlan, members: Members, checkpointer,
           progress: bool) -> None:
    """The epoch loop: each epoch's steps, validation, early stopping and checkpoint."""
    loop, world, device = plan.loop, plan.world, plan.device
    train, val = WindowBatches(plan.data.train, device), WindowBatches(plan.data.val, device)
    step = BackoffStep(train, plan.step, loop.micro_batch_size,
                       loop.effective_batch_size)  # halves on OOM
    steps = RunSteps(world.wrap(parts.model), parts, step, world,  # DDP: rank 0's weights
                     graph=not members.stacked)
    weights = members.val_weights  # None: every validation window counts once
    while members.training(loop.epochs, loop.patience):
        parts.model.train()
        if world.distributed:  # dropout: seeded per rank and epoch (distributed.py)
            torch.manual_seed(epoch_seed(plan.seeds.torch, world.rank, members.state.epoch))
        started = time.perf_counter()
        sizes = _epoch_steps(steps, members, train, plan, progress)
        parts.end_epoch()
        seconds = time.perf_counter() - started
        # rank 0's validation RMSE on every rank: they all stop at the same epoch
        val_rmse = world.broadcast(validation_rmse(parts.evaluated, val, weights=weights))
        split = (step.micro_batch_size, step.accumulation_steps)
        metrics = members.end_epoch(val_rmse, parts.evaluated, partial(
            epoch_metrics, sizes=sizes, seconds=seconds, split=split, device=device))
        if progress:
            members.print_epoch(metrics)
        if checkpointer is not None:
            checkpointer.save(parts, members.state)
        members.tell()


def _epoch_steps(steps: "RunSteps", members: Members, train: WindowBatches,
                 plan: TrainingPlan, progress: bool) -> list[int]:
    """One epoch's steps, each result recorded (on the host at once; on the device, read at
    its end); returns each step's global batch size."""
    batch_size, epoch = plan.global_batch_size, members.state.epoch
    batches = members.batches(len(train), batch_size, epoch, plan.world, plan.device)
    bar = members.progress_bar(batches, steps_per_epoch(len(train), batch_size),
                               plan.loop.epochs, progress)
    sizes = []
    for indices in bar:
        sizes.append(global_batch_size(len(train), batch_size, len(sizes)))
        with collectives():
            result = steps(indices, sizes[-1])
            if result is not None:  # decided on the host (a CPU): recorded now
                members.record(result)
                if not members.stacked:
                    bar.set_postfix(loss=f"{result.loss:.4f}", grad=f"{result.grad_norm:.2f}",
                                    refresh=False)
    for result in steps.read():  # decided on the device: the epoch's records, read once
        members.record(result)
    return sizes


class RunSteps:
    """The run's steps, one effective batch each: decided on the host (a CPU), the result
    returned at once, or on the device (CUDA), its record kept there until `read` (replayed from
    a CUDA graph in one process); the schedule and weight average follow each step."""

    def __init__(self, trained, parts: TrainingParts, step: BackoffStep, world,
                 graph: bool = True):
        self.trained, self.parts, self.step, self.world = trained, parts, step, world
        self.device = step.settings.precision.device
        self.log = StepLog()
        self.graphed = None  # one process on CUDA: each batch size replays its captured step
        if (graph and parts.capturable and self.device.type == "cuda" and not world.distributed
                and cuda_graph.ENABLED):
            self.graphed = cuda_graph.GraphedStep(self._eager, self._captured, self.device)

    def __call__(self, indices: torch.Tensor, total: int) -> StepResult | None:
        """Step over `indices` (this rank's share of `total` samples); its result, with the
        loss averaged over ranks, when the host decided it, else None (kept in the log)."""
        if self.graphed is not None:
            self.log.rows.append(self.graphed(indices))
        elif self.parts.on_device:
            self.log.add(self._take(indices, total, self.step), self.device)
        else:  # a CPU: the values are on the host already
            result = self._take(indices, total, self.step)
            result.loss = self.world.average(result.loss)  # the global sample-weighted loss
            return result
        return None

    def read(self) -> list[StepResult]:
        """The records kept on the device since the last read: one read (and one all-reduce
        of their losses under DDP); none for a host run."""
        if not self.parts.on_device:
            return []
        results = self.log.read()
        losses = self.world.average_all([r.loss for r in results])
        for result, loss in zip(results, losses, strict=True):
            result.loss = loss
        return results

    def _take(self, indices: torch.Tensor, total: int, attempt) -> StepResult:
        result = attempt(self.trained, self.parts.optimizer, self.parts.scaler, indices, total)
        self.parts.after_step(result)
        return result

    def _eager(self, indices: torch.Tensor) -> torch.Tensor:
        return self._take(indices, len(indices), self.step).packed(self.device)

    def _captured(self, indices: torch.Tensor) -> torch.Tensor:  # no back-off, no host read
        return self._take(indices, len(indices), self.step.attempt).packed(self.device)


def epoch_metrics(results: list[StepResult], sizes: list[int], seconds: float, val_rmse: float,
                  split: tuple[int, int], device: torch.device) -> dict[str, float]:
    """An epoch's metrics from its steps' results and global batch sizes (in step order);
    `split`: the (micro-batch size, accumulation steps) it ended with."""
    seen = sum(sizes)
    loss_sum = sum(r.loss * n for r, n in zip(results, sizes, strict=True))
    return {"train_loss_epoch": loss_sum / max(seen, 1), "val_rmse": val_rmse,
            "samples_per_s": seen / seconds, "peak_memory_mb": peak_memory_mb(device),
            "micro_batch_size": split[0],  # smaller after an OOM back-off
            "accumulation_steps": split[1]}


def _resumed(parts: TrainingParts, plan: TrainingPlan) -> TrainState:
    """The state `plan` resumes with its parts loaded from the checkpoint, or a fresh one."""
    if plan.resume is None:
        return TrainState()
    parts.load_state_dict(plan.resume)
    if not plan.world.distributed:  # N ranks re-seed per epoch instead (distributed.py)
        checkpoint.restore_rng_state(plan.resume["rng"])
    return TrainState.from_dict(plan.resume["train_state"])



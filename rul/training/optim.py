"""What changes while a run trains, and what a checkpoint restores: the model, its optimizer
(AdamW, or Muon with AdamW), learning-rate schedule, GradScaler and weight average (EMA), held
by TrainingParts."""

import math

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from rul.training.optimizers import OPTIMIZER_KINDS
from rul.training.settings import OptimizerSettings
from rul.training.step import StepResult
from rul.training.sync_free import DeviceSchedule, average_on_device


def steps_per_epoch(n_windows: int, effective_batch_size: int) -> int:
    return math.ceil(n_windows / effective_batch_size)


def make_optimizer(model, settings: OptimizerSettings, sync_free: bool | None = None
                   ) -> torch.optim.Optimizer:
    """The optimizer of `settings` (its row of OPTIMIZER_KINDS). Sync-free (default: on CUDA)
    an optimizer that can decides on the device: its rate a tensor there, the step's skip
    decided there (step.decides_on_device reads `optimizer.on_device`), the schedule set there
    (sync_free.DeviceSchedule). Never with `scheduler: onecycle`, which cycles Adam's beta1, a
    number the optimizer takes from the host (a captured step would keep its first value):
    such a run keeps the host's decisions."""
    row = OPTIMIZER_KINDS[settings.kind]
    if sync_free is None:
        sync_free = next(model.parameters()).device.type == "cuda"
    on_device = bool(sync_free and row.on_device and settings.scheduler != "onecycle")
    optimizer = row.build(model, settings, on_device)
    optimizer.on_device = on_device
    return optimizer


def adamw(model, settings: OptimizerSettings, on_device: bool) -> torch.optim.Optimizer:
    """AdamW, as every CPU run has trained; on the device fused and capturable, its rate a
    tensor on the model's device, so that a CUDA graph can capture its step."""
    if not on_device:
        return torch.optim.AdamW(model.parameters(), lr=settings.lr,
                                 weight_decay=settings.weight_decay)
    device = next(model.parameters()).device
    return torch.optim.AdamW(model.parameters(),
                             lr=torch.tensor(settings.lr, dtype=torch.float32, device=device),
                             weight_decay=settings.weight_decay, fused=True, capturable=True)


def load_optimizer_state(optimizer, saved: dict, kind: str) -> None:
    """Load `saved` into `optimizer` (of the row `kind`), which keeps how it computes (fused or
    not, capturable, its rate a tensor or a number): a checkpoint moves between a CPU run and
    a CUDA run."""
    own = OPTIMIZER_KINDS[kind].kept_on_resume
    groups = []
    for mine, theirs in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        theirs = {**theirs, **{key: mine[key] for key in own if key in mine}}
        theirs["lr"] = float(theirs["lr"])
        groups.append(theirs)
    rates = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict({**saved, "param_groups": groups})
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        if isinstance(rate, torch.Tensor):  # the same tensor (a CUDA graph may hold it)
            group["lr"] = rate.fill_(group["lr"])


def make_scheduler(optimizer, settings: OptimizerSettings, total_steps: int):
    """Stepped once per real optimizer step (never after a skipped fp16 step); None = constant.
    With warmup_epochs, the rate rises linearly over those epochs' steps first (warmed_up)."""
    warmup = total_steps * settings.warmup_epochs // settings.epochs
    if warmup:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmed_up(warmup, total_steps, settings.scheduler == "cosine"))
    if settings.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    if settings.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, settings.lr,
                                                   total_steps=total_steps)
    return None


def warmed_up(warmup: int, total_steps: int, cosine: bool):
    """The rate's factor at step n: (n + 1) / warmup over the first `warmup` steps (the last
    of them at the full rate), then 1, or with `cosine` the cosine from 1 to 0 over the steps
    left (CosineAnnealingLR's curve, in closed form)."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total_steps - warmup)
                                   / max(total_steps - warmup, 1)))

    return factor


def ema_with_warmup(decay: float):
    """AveragedModel update: w_avg <- d*w_avg + (1-d)*w with d = min(decay, (1+n)/(10+n)).

    n = updates so far. The warm-up keeps the average near the current weights while they move
    fast, so averaging in early weights far from where training ends cannot stall validation
    (and with it early stopping).
    """
    def update(averaged: list, current: list, n_averaged: torch.Tensor) -> None:
        n = int(n_averaged)
        d = min(decay, (1 + n) / (10 + n))
        for a, c in zip(averaged, current, strict=True):
            a.lerp_(c, 1 - d)

    return update


def weight_average(model: nn.Module, decay: float) -> AveragedModel | None:
    """torch's AveragedModel with the warm-up above, its update count on the model's device
    (a sync-free step counts there: sync_free.average_on_device); None when `decay` is 0."""
    if not decay:
        return None
    device = next(model.parameters()).device
    return AveragedModel(model, device=device, multi_avg_fn=ema_with_warmup(decay),
                         use_buffers=True)


class TrainingParts:
    """What changes while training, and what a checkpoint restores: the model, its optimizer,
    GradScaler, schedule and weight average.

    On a CPU the step's skip decision is read on the host and the scheduler and weight
    average follow it there. With a sync-free optimizer (CUDA: make_optimizer) they
    follow it on the device (sync_free.py) and the host scheduler is brought up to date once
    per epoch (`end_epoch`), so a checkpoint holds the same state either way."""

    def __init__(self, model, settings: OptimizerSettings, precision, total_steps: int):
        self.model, self.kind = model, settings.kind
        self.precision = precision.name  # saved: a resumed run keeps it (resolve_precision)
        self.optimizer = make_optimizer(model, settings)
        self.on_device = self.optimizer.on_device
        self.capturable = self.on_device and OPTIMIZER_KINDS[settings.kind].capturable
        self.scaler = precision.grad_scaler()
        self.schedule = None
        if self.on_device and (settings.scheduler != "none" or settings.warmup_epochs):
            self.schedule = DeviceSchedule(
                self.optimizer, lambda host: make_scheduler(host, settings, total_steps),
                total_steps, settings.lr)
            self.scheduler = self.schedule.scheduler
        else:
            self.scheduler = make_scheduler(self.optimizer, settings, total_steps)
        self.average = weight_average(model, settings.ema_decay)
        self.decay = settings.ema_decay

    @property
    def evaluated(self):
        """What validation and the returned model use: the weight average when there is one."""
        return self.average.module if self.average is not None else self.model

    def after_step(self, result: StepResult) -> None:
        """Schedule and weight average move only when the optimizer really stepped (stacked
        members: unless every member's step was skipped)."""
        if self.on_device:
            skipped = ~result.stepped
            if self.schedule is not None:
                self.schedule.after_step(skipped)
            if self.average is not None:
                average_on_device(self.average, self.model, skipped, self.decay)
        elif result.stepped:
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
        load_optimizer_state(self.optimizer, saved["optimizer"], self.kind)
        self.scaler.load_state_dict(saved["scaler"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(saved["scheduler"])
        if self.schedule is not None:
            self.schedule.loaded()
        if self.average is not None:
            self.average.load_state_dict(saved["ema"])

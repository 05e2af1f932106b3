"""The epoch loop: effective batches -> optimizer_step, validation, early stopping, checkpoints."""

import copy
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel
from tqdm.auto import tqdm

from rul.evaluation.metrics import rmse
from rul.training import checkpoint
from rul.training.batching import WindowBatches, effective_batches
from rul.training.step import StepResult, optimizer_step


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


class Callback:
    """Hooks for tracking. The engine knows nothing about MLflow."""

    def on_step(self, state: TrainState, result: StepResult) -> None: ...
    def on_epoch(self, state: TrainState, metrics: dict) -> None: ...


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


def make_optimizer(model, config):
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def make_scheduler(optimizer, config, total_steps: int):
    if config.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    if config.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, config.lr, total_steps=total_steps)
    return None


@torch.inference_mode()
def predict(model, precision, batches: WindowBatches, batch_size: int = 4096) -> np.ndarray:
    model.eval()
    outputs = []
    for x, _ in batches.in_order(batch_size):
        with precision.autocast():
            outputs.append(model(x).float())
    return torch.cat(outputs).cpu().numpy() if outputs else np.empty(0, np.float32)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def fit(model, config, precision, seeds, train: WindowBatches, val: WindowBatches,
        callback: Callback | None = None, checkpoint_path=None, resume_from: dict | None = None,
        progress: bool = True, checkpoint_extra: dict | None = None) -> TrainState:
    """Train with early stopping on validation RMSE; return the state with best weights loaded."""
    callback = callback or Callback()
    optimizer = make_optimizer(model, config)
    scaler = precision.grad_scaler()
    steps_per_epoch = math.ceil(len(train) / config.effective_batch_size)
    scheduler = make_scheduler(optimizer, config, config.epochs * steps_per_epoch)
    ema = (AveragedModel(model, multi_avg_fn=ema_with_warmup(config.ema_decay),
                         use_buffers=True) if config.ema_decay else None)
    evaluated = ema.module if ema is not None else model  # what validation and the result use
    state = TrainState()
    if resume_from is not None:
        model.load_state_dict(resume_from["model"])
        optimizer.load_state_dict(resume_from["optimizer"])
        scaler.load_state_dict(resume_from["scaler"])
        if scheduler is not None:
            scheduler.load_state_dict(resume_from["scheduler"])
        if ema is not None:
            ema.load_state_dict(resume_from["ema"])
        state = resume_from["train_state"]
        checkpoint.restore_rng_state(resume_from["rng"])

    while state.epoch < config.epochs and state.bad_epochs < config.patience:
        model.train()
        started, seen, loss_sum = time.perf_counter(), 0, 0.0
        batches = effective_batches(len(train), config.micro_batch_size,
                                    config.accumulation_steps, seeds.shuffle, state.epoch)
        bar = tqdm(batches, total=steps_per_epoch, disable=not progress, leave=False,
                   desc=f"epoch {state.epoch + 1}/{config.epochs}", unit="step")
        last_val = f"{state.history[-1]['val_rmse']:.2f}" if state.history else "nan"
        for micro_indices in bar:
            micro_batches = [train.get(i.to(train.starts.device)) for i in micro_indices]
            result = optimizer_step(model, optimizer, scaler, micro_batches, precision,
                                    config.max_grad_norm, target_scale=config.rul_cap)
            state.step += 1
            if result.skipped:
                state.skipped_steps += 1
            else:  # only when the optimizer really stepped
                if scheduler is not None:
                    scheduler.step()
                if ema is not None:
                    ema.update_parameters(model)
            n = sum(len(i) for i in micro_indices)
            seen, loss_sum = seen + n, loss_sum + result.loss * n
            callback.on_step(state, result)
            bar.set_postfix(loss=f"{result.loss:.4f}", grad=f"{result.grad_norm:.2f}",
                            val_rmse=last_val, refresh=False)
        train_seconds = time.perf_counter() - started
        val_rmse = rmse(predict(evaluated, precision, val), val.targets.cpu().numpy())
        state.epoch += 1
        if val_rmse < state.best_val_rmse:
            state.best_val_rmse, state.best_epoch, state.bad_epochs = val_rmse, state.epoch, 0
            state.best_weights = copy.deepcopy(evaluated.state_dict())
        else:
            state.bad_epochs += 1
        metrics = {"train_loss_epoch": loss_sum / max(seen, 1), "val_rmse": val_rmse,
                   "samples_per_s": seen / train_seconds,
                   "peak_memory_mb": peak_memory_mb(precision.device)}
        state.history.append(metrics)
        if progress:
            tqdm.write(f"epoch {state.epoch:3d}  train_loss {metrics['train_loss_epoch']:.5f}  "
                       f"val_rmse {val_rmse:6.2f}  best {state.best_val_rmse:6.2f}"
                       f"@{state.best_epoch}  {metrics['samples_per_s']:,.0f} samples/s")
        if checkpoint_path is not None:
            checkpoint.save(checkpoint_path, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "ema": ema.state_dict() if ema is not None else None,
                "train_state": state, "rng": checkpoint.rng_state(), **(checkpoint_extra or {}),
            })
        callback.on_epoch(state, metrics)

    if state.best_weights is not None:
        model.load_state_dict(state.best_weights)
    return state

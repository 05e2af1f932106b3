"""Optimizer and learning-rate schedule of a training run."""

import math

import torch


def steps_per_epoch(n_windows: int, effective_batch_size: int) -> int:
    return math.ceil(n_windows / effective_batch_size)


def make_optimizer(model, config) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def make_scheduler(optimizer, config, total_steps: int):
    """Stepped once per real optimizer step (never after a skipped fp16 step); None = constant."""
    if config.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    if config.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, config.lr, total_steps=total_steps)
    return None

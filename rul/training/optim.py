"""Optimizer and learning-rate schedule of a training run."""

import math

import torch


def steps_per_epoch(n_windows: int, effective_batch_size: int) -> int:
    return math.ceil(n_windows / effective_batch_size)


def make_optimizer(model, config, sync_free: bool | None = None) -> torch.optim.Optimizer:
    """AdamW. Sync-free (default: on CUDA) it is fused and capturable, its learning rate a
    tensor on the model's device: the step then skips on the device (a found_inf it is given),
    the schedule sets the rate there (sync_free.DeviceSchedule), and a CUDA graph can capture
    it all. Never with `scheduler: onecycle`, which cycles Adam's beta1, a number the fused
    kernel takes from the host: such a run keeps the host's decisions (one sync per step).
    Otherwise (a CPU) plain AdamW, as every CPU run has trained."""
    device = next(model.parameters()).device
    if sync_free is None:
        sync_free = device.type == "cuda"
    if sync_free and config.scheduler != "onecycle":
        return torch.optim.AdamW(model.parameters(),
                                 lr=torch.tensor(config.lr, dtype=torch.float32, device=device),
                                 weight_decay=config.weight_decay, fused=True, capturable=True)
    return torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def decides_on_device(optimizer) -> bool:
    """Whether `optimizer` takes the skip decision as a tensor and its rate as one (fused
    AdamW, see make_optimizer): the training step then never waits for the device."""
    return all(group.get("fused") and isinstance(group["lr"], torch.Tensor)
               for group in optimizer.param_groups)


def load_optimizer_state(optimizer, saved: dict) -> None:
    """Load `saved` into `optimizer`, which keeps how it computes (fused or not, capturable,
    its rate a tensor or a number): a checkpoint moves between a CPU run and a CUDA run."""
    own = ("fused", "capturable", "foreach", "differentiable")
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


def make_scheduler(optimizer, config, total_steps: int):
    """Stepped once per real optimizer step (never after a skipped fp16 step); None = constant."""
    if config.scheduler == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    if config.scheduler == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, config.lr, total_steps=total_steps)
    return None

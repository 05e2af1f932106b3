"""Effective batches drawn from in-memory tensors by a seeded permutation.

The sequence of effective batches depends only on the seed, the epoch and the effective batch
size B = micro_batch_size x K x world_size, never on how B is split into micro-batches (the
step splits each batch it is given).
"""

import math

import numpy as np
import torch

from rul.training.distributed import World


class WindowBatches:
    """Windows of one split held as tensors on the training device: `values` are the
    normalized rows, window i rows starts[i] .. starts[i]+window-1, a batch one indexing op.
    Targets are one per window, or a range [lower, upper] (2, n) where some are ranges (engines
    in service: rul.preprocessing.censored); a batch's targets keep the samples last."""

    def __init__(self, window_set, device: torch.device):
        self.values = torch.as_tensor(window_set.values, device=device)
        self.starts = torch.as_tensor(window_set.starts, device=device)
        targets = window_set.targets if window_set.upper is None else \
            np.stack([window_set.targets, window_set.upper])
        self.targets = torch.as_tensor(targets, device=device)
        self.offsets = torch.arange(window_set.window, device=device)

    def __len__(self) -> int:
        return len(self.starts)

    def get(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.starts[index, None] + self.offsets  # (b, window)
        return self.values[rows], self.targets[..., index]

    def in_order(self, batch_size: int):
        for index in torch.arange(len(self), device=self.starts.device).split(batch_size):
            yield self.get(index)


def effective_batches(windows: int | torch.Tensor, batch_size: int, seed: int, epoch: int,
                      world: World | None = None, device: torch.device | None = None):
    """Yield, per optimizer step, this rank's share (rank r of N takes batch[r::N]) of an
    effective batch of `batch_size` indices; the step splits it into micro-batches.

    `windows`: their number (each drawn once an epoch, shuffled) or each window's probability
    (train_sampling: truncation; as many drawn with replacement). The order is seeded by
    (seed, epoch), drawn on the CPU and moved to `device` once per epoch, so a resumed run
    draws the same batches on every device. The last effective batch may be short.
    """
    world = world or World()
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    if isinstance(windows, int):
        order = torch.randperm(windows, generator=generator)
    else:
        order = torch.multinomial(windows, len(windows), replacement=True, generator=generator)
    if device is not None and device.type != "cpu":
        order = order.pin_memory().to(device, non_blocking=True)
    for batch in order.split(batch_size):
        yield batch[world.rank::world.size]


def member_batches(windows: list, batch_size: int, seeds: list[int], epoch: int,
                   device: torch.device | None = None):
    """Yield, per optimizer step, (members, batch) indices: each stacked member's effective
    batch as effective_batches draws it for its windows (a number or its law) and seed."""
    orders = [effective_batches(law, batch_size, seed, epoch, device=device)
              for law, seed in zip(windows, seeds, strict=True)]
    for indices in zip(*orders, strict=True):
        yield torch.stack(indices)


def micro_batch_split(effective_batch_size: int, micro_batch_size: int) -> str | None:
    """'256 + 244' (or '62 x 8 + 4') when the micro-batches do not divide the effective
    batch, so that its last micro-batch is short; None when B = micro x K."""
    k = math.ceil(effective_batch_size / micro_batch_size)
    last = effective_batch_size - micro_batch_size * (k - 1)
    if last == micro_batch_size:
        return None
    full = f"{micro_batch_size}" if k == 2 else f"{k - 1} x {micro_batch_size}"
    return f"{full} + {last}"


def split_note(effective_batch_size: int, micro_batch_size: int) -> str | None:
    """One line saying how an effective batch that micro x K does not divide is trained."""
    split = micro_batch_split(effective_batch_size, micro_batch_size)
    if split is None:
        return None
    return (f"effective_batch_size={effective_batch_size} trains as micro-batches of {split} "
            f"(the last one short); each step weights its samples exactly, so the model is "
            f"that of B={effective_batch_size}")

"""Effective batches drawn from in-memory tensors by a seeded permutation.

The sequence of effective batches depends only on the seed, the epoch and the effective batch
size B = micro_batch_size x K x world_size, never on how B is split into micro-batches (the
step splits each batch it is given).
"""

import math

import torch

from rul.training.distributed import World


class WindowBatches:
    """Windows of one split held as tensors on the training device.

    `values` are the normalized rows; window i is rows starts[i] .. starts[i]+window-1. A batch
    gathers its windows with one indexing op (no Dataset/DataLoader per-sample overhead).
    """

    def __init__(self, window_set, device: torch.device):
        self.values = torch.as_tensor(window_set.values, device=device)
        self.starts = torch.as_tensor(window_set.starts, device=device)
        self.targets = torch.as_tensor(window_set.targets, device=device)
        self.offsets = torch.arange(window_set.window, device=device)

    def __len__(self) -> int:
        return len(self.starts)

    def get(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.starts[index, None] + self.offsets  # (b, window)
        return self.values[rows], self.targets[index]

    def in_order(self, batch_size: int):
        for index in torch.arange(len(self), device=self.starts.device).split(batch_size):
            yield self.get(index)


def effective_batches(windows: int | torch.Tensor, batch_size: int, seed: int, epoch: int,
                      world: World | None = None, device: torch.device | None = None):
    """Yield, per optimizer step, this rank's share of an effective batch of `batch_size`
    indices (over all ranks: rank r of N takes batch[r::N]); the step splits it into
    micro-batches.

    `windows` is their number, each window drawn once an epoch in a shuffle, or each window's
    probability (train_sampling: truncation), as many windows drawn from it with
    replacement: an epoch takes as many steps either way.

    The order is seeded by (seed, epoch) so a resumed run draws the same batches, on every
    device alike: it is drawn on the CPU (about 0.1 ms for FD001) and moved to `device` in
    one copy per epoch, so that no step waits for an index to cross. The last effective
    batch of an epoch may be short; the step weights each sample by its share of the batch,
    so nothing is ÷K there.
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
    """Yield, per optimizer step, each of stacked members' effective batch of indices as
    effective_batches draws it for that member's windows (a number or its law) and shuffle
    seed: (members, batch) indices."""
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

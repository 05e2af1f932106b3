"""One training run on N processes (torchrun): who am I, the process group, and the helpers
the epoch loop needs. A world of 1 (no torchrun) is the plain path: no process group at all.

Every rank draws the same permutation (batching.py), so it knows each effective batch's global
size without a collective. Rank r trains on batch[r::N], each micro-batch weighted by its share
of the global batch x N as DDP averages gradients (`share_weights`), an empty share as one
zero-weight micro-batch. Rank 0's validation RMSE is broadcast so that every rank stops
together; dropout is re-seeded from (seed, rank, epoch) (`epoch_seed`), so a checkpoint holds
no per-rank RNG state (docs: Scale out).
"""

import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


class PeerLost(RuntimeError):
    """A collective failed: another rank died (or the group was torn down)."""


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "World":
        """torchrun's RANK / WORLD_SIZE / LOCAL_RANK; a world of 1 without them."""
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP around `model` (which keeps its own parameters, optimizer and state dict)."""
        if not self.distributed:
            return model
        device = next(model.parameters()).device
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    def average(self, value: float) -> float:
        """Mean over ranks of a float (one all-reduce); the value itself in a world of 1."""
        if not self.distributed:
            return value
        with collectives():
            tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
            dist.all_reduce(tensor)
        return float(tensor.item()) / self.size

    def average_all(self, values: list) -> list[float]:
        """`average` of each value, with one all-reduce for them all (a list of floats)."""
        if not self.distributed:
            return values
        with collectives():
            tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
            dist.all_reduce(tensor)
        return (tensor / self.size).tolist()

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank (a picklable object: a float, a checkpoint dict)."""
        if not self.distributed:
            return obj
        holder = [obj]
        with collectives():
            dist.broadcast_object_list(holder, src=0, device=_collective_device())
        return holder[0]


def current_world() -> World:
    """The torchrun world once its process group is up; a world of 1 otherwise."""
    return World.from_env() if dist.is_available() and dist.is_initialized() else World()


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else torch.device("cpu")


@contextmanager
def process_group(world: World, device: str):
    """Init the process group for the block (gloo on CPU, nccl with the local GPU on CUDA:
    `device` is the config's key, auto, cpu or cuda); nothing in a world of 1."""
    if not world.distributed:
        yield
        return
    from rul.training.precision import resolve_device

    cuda = resolve_device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=world.rank, world_size=world.size)
    try:
        yield
        dist.barrier()  # no rank tears its group down while a peer still talks to it
    finally:
        dist.destroy_process_group()


@contextmanager
def collectives():
    """Inside, a failed collective raises PeerLost, and this process then ignores the SIGTERM
    torchrun sends when a rank dies: it must not cut short the clean-up that ends the run FAILED."""
    try:
        yield
    except RuntimeError as error:
        if isinstance(error, PeerLost) or not _from_the_group(error):
            raise
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise PeerLost(f"rank {dist.get_rank()}: another rank of the run stopped "
                       f"(a collective failed: {str(error).splitlines()[0][:300]})") from None


def _from_the_group(error: RuntimeError) -> bool:
    """NCCL raises DistError; gloo a RuntimeError naming its transport (not an OOM, a bug)."""
    return dist.is_available() and dist.is_initialized() and (
        isinstance(error, dist.DistError) or "gloo" in str(error))


def global_batch_size(n: int, effective_batch_size: int, step_in_epoch: int) -> int:
    """Samples of the epoch's `step_in_epoch`-th (0-based) effective batch, over all ranks."""
    return min(effective_batch_size, n - step_in_epoch * effective_batch_size)


def share_weights(micro_sizes: list[int], global_total: int, world_size: int) -> list[float]:
    """Each micro-batch's loss weight: its share of the global batch, x world size because
    DDP averages gradients over ranks. In a world of 1: len / total, as before."""
    return [size * world_size / global_total for size in micro_sizes]


def rank_seed(torch_seed: int, rank: int) -> int:
    """The dropout seed of `rank` (logged as tag seed.rank_<r>)."""
    return int(np.random.SeedSequence([torch_seed, rank]).generate_state(1)[0])


def epoch_seed(torch_seed: int, rank: int, epoch: int) -> int:
    return int(np.random.SeedSequence([rank_seed(torch_seed, rank), epoch])
               .generate_state(1)[0])


def rank_share(train, micro_indices: list[torch.Tensor], global_total: int, world_size: int):
    """This rank's micro-batches [(x, y), ...] of one step and their weights (None: len/total,
    one process); an empty share is one zero-weight micro-batch, to join the all-reduce."""
    device = micro_indices[0].device  # a split always yields at least one (maybe empty) part
    if world_size == 1:
        return [train.get(i.to(device)) for i in micro_indices], None
    micro_indices = [i for i in micro_indices if len(i)]  # an empty share splits into [[]]
    if not micro_indices:
        return [train.get(torch.zeros(1, dtype=torch.long, device=device))], [0.0]
    return ([train.get(i.to(device)) for i in micro_indices],
            share_weights([len(i) for i in micro_indices], global_total, world_size))

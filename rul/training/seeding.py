"""One seed drives everything; the derived seeds are returned so tracking can record them."""

import dataclasses
import os
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Seeds:
    seed: int
    split: int  # validation units
    shuffle: int  # batch order (re-derived per epoch)
    torch: int  # weight init, dropout
    numpy: int
    python: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def derive_seeds(seed: int, split_seed: int | None = None) -> Seeds:
    """Every stream's seed from `seed`, the validation split's from `split_seed` (default:
    `seed`, as every run split before the key existed)."""
    children = np.random.SeedSequence(seed).generate_state(5, dtype=np.uint32)
    seeds = Seeds(seed, *(int(c) for c in children))
    if split_seed is None or split_seed == seed:
        return seeds
    return dataclasses.replace(seeds, split=derive_seeds(split_seed).split)


def seed_everything(seeds: Seeds | int, deterministic: bool = False) -> Seeds:
    """Seed Python's, numpy's and torch's global generators from `seeds` (or a seed); with
    `deterministic`, also switch torch to deterministic algorithms."""
    seeds = derive_seeds(seeds) if isinstance(seeds, int) else seeds
    random.seed(seeds.python)
    np.random.seed(seeds.numpy)
    torch.manual_seed(seeds.torch)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return seeds

class RandomState:
    """A snapshot of torch's random streams on `device` (the CPU generator, and the device's
    own on CUDA), put back by `restore()`: work that must not move a run's draws (the memory
    probe, a step redone after an out-of-memory back-off) runs between the two."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)

"""One seed drives everything; the derived seeds are returned so tracking can record them."""

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


def derive_seeds(seed: int) -> Seeds:
    children = np.random.SeedSequence(seed).generate_state(5, dtype=np.uint32)
    return Seeds(seed, *(int(c) for c in children))


def seed_everything(seed: int, deterministic: bool = False) -> Seeds:
    seeds = derive_seeds(seed)
    random.seed(seeds.python)
    np.random.seed(seeds.numpy)
    torch.manual_seed(seeds.torch)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return seeds

"""Atomic checkpoints: everything needed to continue a run exactly where it stopped."""

import os
import random
from pathlib import Path

import numpy as np
import torch

from rul.interrupts import deferred


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: str | Path, state: dict) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    torch.save(state, partial)
    os.replace(partial, path)


def load(path: str | Path, device: torch.device | str = "cpu") -> dict:
    return torch.load(path, map_location=device, weights_only=False)


class Checkpointer:
    """Saves a run's training parts and state after every epoch to one file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def save(self, parts, state) -> None:
        with deferred():  # a signal waits for the file to be complete
            save(self.path, {**parts.state_dict(), "train_state": state, "rng": rng_state()})

    def load(self, device: torch.device | str = "cpu") -> dict:
        if not self.path.is_file():
            raise FileNotFoundError(f"no checkpoint to resume at {self.path}")
        return load(self.path, device)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

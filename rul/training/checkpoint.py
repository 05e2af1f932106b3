"""Checkpoints that can be trusted: everything needed to continue a run exactly where it
stopped, written so that a crash never leaves less than the previous good checkpoint, and
verified when read.

A checkpoint file is a header, MAGIC and the SHA-256 of what follows, then torch.save's
bytes. `save` writes `<name>.part` and syncs it to disk, keeps the current file as
`<name>.prev`, renames the new one into place and syncs the folder: a crash at any moment
leaves the newest complete checkpoint under `<name>` or `<name>.prev`. `load` checks the
digest before unpickling and raises CheckpointDamaged for a file cut short, changed or
unreadable. A file without the header (torch.save's zip, written by an older rul) is read as
it is.
"""

import hashlib
import io
import os
import random
from pathlib import Path

import numpy as np
import torch

from rul.interrupts import deferred

MAGIC = b"rul-checkpoint-sha256\n"
DIGEST_SIZE = hashlib.sha256().digest_size


class CheckpointDamaged(Exception):
    """A checkpoint file that cannot be trusted (cut short, changed, or not readable)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"checkpoint {path} is damaged: {reason}")
        self.path, self.reason = Path(path), reason


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


def previous(path: str | Path) -> Path:
    """Where `save` keeps the checkpoint before the newest."""
    path = Path(path)
    return path.with_name(path.name + ".prev")


def partial(path: str | Path) -> Path:
    """Where `save` writes before renaming (left behind only by a crash mid-write)."""
    path = Path(path)
    return path.with_name(path.name + ".part")


def save(path: str | Path, state: dict) -> None:
    """Write `state` with its digest beside `path`, sync it, keep the current file as the
    previous one, rename the new one into place and sync the folder (module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    try:
        with open(partial(path), "wb") as file:
            file.write(MAGIC + hashlib.sha256(payload).digest())
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:  # a full disk: leave no half-written file, name the one it was
        partial(path).unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(path)) from None
    if path.exists():
        os.replace(path, previous(path))
    os.replace(partial(path), path)
    _sync_folder(path.parent)


def load(path: str | Path) -> dict:
    """The checkpoint at `path`, verified, with every tensor on the CPU; CheckpointDamaged if
    it cannot be trusted, FileNotFoundError if there is none.

    Read onto the CPU whatever device wrote it or will train on: the training parts'
    load_state_dict put each tensor on its parameter's device, and the random states must
    stay CPU ByteTensors (torch.set_rng_state and torch.cuda.set_rng_state take no other)."""
    path = Path(path)
    payload = _verified_payload(path, path.read_bytes())
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as error:  # unpickling raises anything from a damaged stream
        said = str(error).strip().split("\n")[0].split(". ")[0][:160]  # its first sentence
        raise CheckpointDamaged(path, f"torch.load cannot read it ({type(error).__name__}"
                                      f"{': ' + said if said else ''})") from None


def _verified_payload(path: Path, data: bytes) -> memoryview | bytes:
    header = len(MAGIC) + DIGEST_SIZE
    if data.startswith(MAGIC):
        payload = memoryview(data)[header:]
        if hashlib.sha256(payload).digest() != data[len(MAGIC):header]:
            raise CheckpointDamaged(path, "its SHA-256 does not match: cut short or changed "
                                          "after it was written")
        return payload
    if not data.startswith(b"PK"):  # neither ours nor an older rul's (a torch zip file)
        raise CheckpointDamaged(path, f"not a checkpoint ({len(data)} bytes, no header)")
    return data  # an older rul's file: torch.load is its only check


def _sync_folder(folder: Path) -> None:
    """Make the renames durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


class Checkpointer:
    """Saves a run's training parts and state after every epoch to one file (and keeps the
    one before it, see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def save(self, parts, state) -> None:
        with deferred():  # a signal waits for the file to be complete
            save(self.path, {**parts.state_dict(), "train_state": state, "rng": rng_state()})

    def load(self) -> dict:
        if not self.path.is_file():
            raise FileNotFoundError(f"no checkpoint to resume at {self.path}")
        return load(self.path)

    def exists(self) -> bool:
        return self.path.is_file() or previous(self.path).is_file()

    def remove(self) -> None:
        for path in (self.path, previous(self.path), partial(self.path)):
            path.unlink(missing_ok=True)

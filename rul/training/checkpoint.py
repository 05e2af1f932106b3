"""Checkpoints that can be trusted: everything needed to continue a run exactly where it
stopped, never less than the previous good checkpoint after a crash, verified when read, and
never able to run code.

A file is MAGIC and the SHA-256 of what follows, then torch.save's bytes of tensors and plain
data only (`plain`). `save` writes `<name>.part`, keeps the current file as `<name>.prev` and
renames the new one into place, syncing each. `load` checks the digest and reads with torch's
weights-only unpickler: anything else (a crafted file naming a function to call) is
CheckpointRefused before it runs; a file cut short, changed or unreadable, CheckpointDamaged.
An earlier rul's files (LEGACY_MAGIC, or a bare torch zip) also hold its TrainState and numpy's
random state: allowed by LEGACY_GLOBALS and nothing more, and turned into the plain form.
"""

import hashlib
import io
import os
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from rul.errors import InputError
from rul.files import sync_folder
from rul.interrupts import deferred
from rul.training.state import TrainState

MAGIC = b"rul-checkpoint-v2-sha256\n"  # tensors and plain data only
LEGACY_MAGIC = b"rul-checkpoint-sha256\n"  # an earlier rul's: its TrainState, numpy's state
DIGEST_SIZE = hashlib.sha256().digest_size
PLAIN = (str, int, float, bool, bytes, type(None), torch.Tensor, torch.dtype, torch.Size)


class CheckpointDamaged(InputError):
    """A checkpoint file that cannot be trusted (cut short, changed, or not readable)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"checkpoint {path} is damaged: {reason}")
        self.path, self.reason = Path(path), reason


class CheckpointRefused(InputError):
    """A checkpoint that holds more than tensors and plain data: rul never writes one, so it
    is not read (nothing in it ran) and left where it is."""

    def __init__(self, path: Path, found: list[str]):
        named = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        super().__init__(
            f"checkpoint {path} is refused: it holds objects that are not tensors or plain "
            f"data ({named}), which rul never writes; nothing in it was run. If you did not "
            "make it, delete it; to continue the run, resume from a checkpoint rul wrote, or "
            "start over: the same command without --resume")
        self.path, self.found = Path(path), found


def rng_state() -> dict:
    """The global random streams as plain data (numpy's key array as an int64 tensor)."""
    state = {"python": random.getstate(), "numpy": _plain_numpy_state(np.random.get_state()),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state((saved["bit_generator"], saved["key"].numpy().astype(np.uint32),
                         saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plain_numpy_state(state: tuple) -> dict:
    """np.random.get_state()'s tuple as plain data."""
    name, key, pos, has_gauss, cached = state
    return {"bit_generator": str(name), "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def plain(value, where: str = "state"):
    """`value` with numpy's scalars made Python numbers; TypeError naming the place of
    anything that is not a tensor or plain data (it would not load: a bug, said at once)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, dict):
        items = [(k, plain(v, f"{where}[{k!r}]")) for k, v in value.items()]
        return OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
    if isinstance(value, list | tuple):
        return type(value)(plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(f"a checkpoint holds tensors and plain data only: {where} is a "
                    f"{type(value).__qualname__}")


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
    torch.save(plain(state), buffer)
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
    sync_folder(path.parent)


# What `Checkpointer.save` writes: the training parts (rul.training.optim), the run's progress
# and the random streams; a checkpoint without any of them cannot continue a run.
KEYS = ("model", "optimizer", "precision", "scaler", "scheduler", "ema", "train_state", "rng")
RNG_KEYS = ("python", "numpy", "torch")


def load(path: str | Path, epochs: int | None = None) -> dict:
    """The checkpoint at `path`, verified, every tensor on the CPU (the training parts'
    load_state_dict move each to its device; the random states must stay CPU ByteTensors);
    CheckpointRefused if it holds anything but tensors and plain data, CheckpointDamaged if it
    cannot be trusted (its plain data not what rul writes for a run of `epochs` epochs
    included: `problem`), FileNotFoundError if there is none."""
    path = Path(path)
    data = path.read_bytes()
    payload, legacy = _verified_payload(path, data)
    allowed = LEGACY_GLOBALS if legacy else []
    try:
        with torch.serialization.safe_globals(allowed):
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as error:  # unpickling raises anything from a damaged stream
        found = _unsafe_globals(payload, allowed)
        if found:
            raise CheckpointRefused(path, found) from None
        said = str(error).strip().split("\n")[0].split(". ")[0][:160]  # its first sentence
        raise CheckpointDamaged(path, f"torch.load cannot read it ({type(error).__name__}"
                                      f"{': ' + said if said else ''})") from None
    state = _from_legacy(state) if legacy else state
    why = problem(state, epochs)
    if why is not None:
        raise CheckpointDamaged(path, why)
    return state


def problem(state, epochs: int | None = None) -> str | None:
    """Why a checkpoint's plain data cannot continue a run: a key rul writes missing, random
    states it cannot restore, a train state rul does not write (TrainState.problem)."""
    if not isinstance(state, dict):
        return "it is not a mapping of the training's parts"
    missing = [key for key in KEYS if key not in state]
    if missing:
        return f"it lacks {', '.join(missing)}"
    rng = state["rng"]
    if not isinstance(rng, dict) or any(key not in rng for key in RNG_KEYS):
        return f"its rng lacks one of {', '.join(RNG_KEYS)}"
    return TrainState.problem(state["train_state"], epochs)


def _unsafe_globals(payload, allowed: list) -> list[str]:
    """The globals a pickle names beyond torch's weights-only set and `allowed` (read from
    its opcodes, nothing run); [] when it cannot be read that far."""
    names = {name for _, name in (a for a in allowed if isinstance(a, tuple))}
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(payload))
    except Exception:  # noqa: BLE001 (damaged: the caller says so)
        return []
    return [name for name in found if name not in names]


def _verified_payload(path: Path, data: bytes) -> tuple[memoryview | bytes, bool]:
    """The torch.save bytes of `data`, its digest checked, and whether an earlier rul wrote
    it (module docstring)."""
    for magic in (MAGIC, LEGACY_MAGIC):
        if data.startswith(magic):
            header = len(magic) + DIGEST_SIZE
            payload = memoryview(data)[header:]
            if hashlib.sha256(payload).digest() != data[len(magic):header]:
                raise CheckpointDamaged(path, "its SHA-256 does not match: cut short or "
                                              "changed after it was written")
            return payload, magic is LEGACY_MAGIC
    if not data.startswith(b"PK"):  # neither ours nor an older rul's (a torch zip file)
        raise CheckpointDamaged(path, f"not a checkpoint ({len(data)} bytes, no header)")
    return data, True  # an older rul's file: torch.load is its only check


def _legacy_globals() -> list:
    """What an earlier rul's checkpoints hold besides tensors and plain data, under the names
    they were written with: its TrainState, and numpy's random state (an array)."""
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's array unpickling function
    return [(TrainState, "rul.training.engine.TrainState"),
            *((reconstruct, f"{package}.multiarray._reconstruct")  # numpy 2's name, and 1's
              for package in ("numpy._core", "numpy.core")),
            (np.ndarray, "numpy.ndarray"), (np.dtype, "numpy.dtype"),
            type(np.dtype(np.uint32))]  # the key array's dtype, built from its state


LEGACY_GLOBALS = _legacy_globals()


def _from_legacy(state: dict) -> dict:
    """An earlier rul's checkpoint in today's plain form."""
    state = dict(state)
    if isinstance(state.get("train_state"), TrainState):
        state["train_state"] = state["train_state"].as_dict()
    rng = state.get("rng")
    if isinstance(rng, dict) and isinstance(rng.get("numpy"), tuple):
        state["rng"] = {**rng, "numpy": _plain_numpy_state(rng["numpy"])}
    return state


class Checkpointer:
    """Saves a run's training parts and state after every epoch to one file (and keeps the
    one before it, see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def save(self, parts, state) -> None:
        with deferred():  # a signal waits for the file to be complete
            save(self.path, {**parts.state_dict(), "train_state": state.as_dict(),
                             "rng": rng_state()})

    def load(self) -> dict:
        if not self.path.is_file():
            raise FileNotFoundError(f"no checkpoint to resume at {self.path}")
        return load(self.path)

    def exists(self) -> bool:
        return self.path.is_file() or previous(self.path).is_file()

    def remove(self) -> None:
        for path in (self.path, previous(self.path), partial(self.path)):
            path.unlink(missing_ok=True)

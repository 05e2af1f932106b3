"""What rul does to files beyond reading them: what it agrees to read (`refusal`: a regular
file, within a size limit, checked before a byte is read), renames made durable
(`sync_folder`), and the user's cache (`cache_folder`, `keep_in_cache`).

Every file rul reads has a limit with a knob to raise it: a config file CONFIG_LIMIT (a
config is a few KB), a training data file `max_data_mb` (DATA_LIMIT), `rul predict --input`
`--max-input-mb` (INPUT_LIMIT). A larger file would cost memory many times its size before
it could be refused; a file that is not a regular file (a folder, a named pipe, a device)
cannot be read twice, as the readers do to name a bad line.
"""

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MB = 2**20


@dataclass(frozen=True)
class SizeLimit:
    """The largest file of a kind rul reads, and the knob that raises it."""

    megabytes: float
    knob: str | None = None  # None: a fixed limit

    def refusal(self, size: int) -> str | None:
        if size <= self.megabytes * MB:
            return None
        raise_it = f" (raise it with {self.knob})" if self.knob else ""
        return f"{size_text(size)} is over the limit of {self.megabytes:g} MB{raise_it}"


CONFIG_LIMIT = SizeLimit(1)
DATA_LIMIT = SizeLimit(2048, "max_data_mb")
INPUT_LIMIT = SizeLimit(256, "--max-input-mb")

KINDS = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a named pipe", stat.S_ISSOCK: "a socket",
         stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}


def refusal(path: str | Path, limit: SizeLimit | None = None) -> str | None:
    """Why rul will not read `path` (it does not exist, is not a regular file, or is larger
    than `limit`), from its metadata alone; None when it may be read."""
    try:
        mode = os.stat(path)
    except FileNotFoundError:
        return "file not found"
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    if not stat.S_ISREG(mode.st_mode):
        kind = next((name for test, name in KINDS.items() if test(mode.st_mode)), "special")
        return f"not a regular file ({kind}); give a file, a copy if need be"
    return limit.refusal(mode.st_size) if limit is not None else None


def size_text(size: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", MB), ("KB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def sync_folder(folder: Path) -> None:
    """Make the renames in `folder` durable (POSIX; a no-op where folders cannot be
    opened)."""
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


USER_CACHE_ENV = "RUL_USER_CACHE"


def cache_folder() -> Path:
    """rul's cache for this user: $RUL_USER_CACHE, else $XDG_CACHE_HOME/rul, else
    ~/.cache/rul. What is kept there saves time and is never needed: a machine's precision
    figures (rul.training.cpu_probe), ONNX graphs traced once (rul.serving.onnx_export), an
    empty MLflow store per MLflow version (rul.tracking.store).
    Delete it at will. Not the downloaded data's folder (data/cmapss/, RUL_CACHE_DIR:
    rul.data.sources), which a run needs."""
    if os.environ.get(USER_CACHE_ENV):
        return Path(os.environ[USER_CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rul"


def keep_in_cache(path: Path, data: bytes) -> None:
    """Write `data` to the cache file `path` whole or not at all: a scratch file renamed over
    it (processes writing the same file at once: either wins). A cache that cannot be written
    (a read-only or full disk) is no error: what it would have kept is redone next time. An
    interrupted write leaves no scratch file."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_bytes(data)
        scratch.replace(path)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            scratch.unlink(missing_ok=True)

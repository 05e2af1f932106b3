"""What rul does to files beyond reading them: what it agrees to read (`refusal`: a regular
file, within a size limit, checked before a byte is read), text written whole or not at all
(`write_whole`), renames made durable (`sync_folder`), and the user's private cache
(`cache_folder`, `CacheFile`).

Every file rul reads has a limit with a knob to raise it: a config file CONFIG_LIMIT (a
config is a few KB), a training data file `max_data_mb` (DATA_LIMIT), `rul predict --input`
`--max-input-mb` (INPUT_LIMIT). A larger file would cost memory many times its size before
it could be refused; a file that is not a regular file (a folder, a named pipe, a device)
cannot be read twice, as the readers do to name a bad line.
"""

import contextlib
import errno
import os
import secrets
import stat
import warnings
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
PRIVATE = 0o700  # the cache's folders; its files are 0600


def cache_folder() -> Path:
    """rul's cache for this user: $RUL_USER_CACHE, else $XDG_CACHE_HOME/rul, else
    ~/.cache/rul. What is kept there saves time and is never needed: a machine's precision
    figures (rul.training.cpu_probe) and ONNX graphs traced once (rul.serving.onnx_export).
    Delete it at will. Not the downloaded data's folder (data/cmapss/, RUL_CACHE_DIR:
    rul.data.sources), which a run needs."""
    if os.environ.get(USER_CACHE_ENV):
        return Path(os.environ[USER_CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rul"


def cache_file(name: str) -> "CacheFile":
    """The file `name` ('folder/file') of rul's cache for this user."""
    return CacheFile(cache_folder(), name)


class NotPrivate(OSError):
    """A cache folder this user does not own, or one that is not a folder."""


@dataclass(frozen=True)
class CacheFile:
    """A file kept in a cache folder private to this user: `root` / `name` ('folder/file').

    Its folders are created 0700, made 0700 when this user owns them, and not used at all
    otherwise; nothing in them is followed through a symlink. A file is written whole (an
    exclusive scratch file, mode 0600, renamed over it) and read only when it is a regular
    file of this user's that no one else may write. What it holds is data its reader verifies
    before use; on any doubt (`doubt`) the reader builds it anew, and one warning line says so.
    A cache that cannot be written (a read-only or full disk) is no error: what it would have
    kept is redone next time."""

    root: Path
    name: str
    own_root: bool = True  # False: a folder the user named, used as it is (never made 0700)

    @property
    def path(self) -> Path:
        return self.root / self.name

    def read(self) -> bytes | None:
        """Its bytes; None when there is none or it cannot be trusted (said once)."""
        *folders, leaf = self.name.split("/")
        try:
            with self._folder(folders, create=False) as folder:
                handle = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
                                 dir_fd=folder)
                with os.fdopen(handle, "rb") as file:
                    why = _untrusted(os.fstat(file.fileno()))
                    if why is None:
                        return file.read()
        except FileNotFoundError:
            return None
        except NotPrivate as error:
            return self.doubt(str(error), "not used")
        except OSError as error:
            if error.errno != errno.ELOOP:
                return None
            why = "a symbolic link"
        self.doubt(why)
        return None

    def keep(self, data: bytes) -> None:
        """Write `data` whole or not at all (processes writing the same file at once: either
        wins); an interrupted write leaves no scratch file."""
        *folders, leaf = self.name.split("/")
        scratch = f".{leaf}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with self._folder(folders, create=True) as folder:
                handle = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o600, dir_fd=folder)
                try:
                    with os.fdopen(handle, "wb") as file:
                        file.write(data)
                    os.rename(scratch, leaf, src_dir_fd=folder, dst_dir_fd=folder)
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(scratch, dir_fd=folder)
        except NotPrivate as error:
            self.doubt(str(error), "not used")
        except OSError:
            pass

    def doubt(self, why: str, then: str = "not trusted, built anew") -> None:
        """One warning line: what is wrong with this cache file and what is done instead."""
        warnings.warn(f"rul's cache: {self.path}: {why}; {then}", stacklevel=3)

    @contextlib.contextmanager
    def _folder(self, folders: list[str], create: bool):
        """A descriptor of the folder `folders` below the root, each level checked as it is
        opened (never through a symlink)."""
        if create:
            (self.root.parent if self.own_root else self.root).mkdir(parents=True,
                                                                      exist_ok=True)
        handles = [_private(self.root, None, create) if self.own_root
                   else os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)]
        try:
            for name in folders:
                handles.append(_private(name, handles[-1], create))
            yield handles[-1]
        finally:
            for handle in handles:
                os.close(handle)


def _private(path, parent: int | None, create: bool) -> int:
    """A descriptor of the folder `path` (in `parent`), created 0700 if `create`; NotPrivate
    when it is a symlink, not a folder, or another user's; made 0700 when it is not."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, PRIVATE, dir_fd=parent)
    try:
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        shown = Path(path).name
        raise NotPrivate(f"folder {shown}: a symbolic link or not a folder") from None
    try:
        found = os.fstat(handle)
        if found.st_uid != os.geteuid():
            raise NotPrivate(f"folder {Path(path).name}: owned by user id {found.st_uid}, "
                             "not by this user")
        if stat.S_IMODE(found.st_mode) != PRIVATE:
            os.fchmod(handle, PRIVATE)
    except BaseException:
        os.close(handle)
        raise
    return handle


def _untrusted(found: os.stat_result) -> str | None:
    """Why a kept file is not trusted, or None."""
    if not stat.S_ISREG(found.st_mode):
        return "not a regular file"
    if found.st_uid != os.geteuid():
        return f"owned by user id {found.st_uid}, not by this user"
    if found.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(found.st_mode):o})"
    return None


def write_whole(path: Path, text: str) -> None:
    """`text` written to `path` whole or not at all: into a scratch file beside it, renamed
    over it (a reader never sees half a page)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)

"""Where a request's work runs, so that one big body never stalls the small ones.

Reading a body and predicting hold Python's GIL for long stretches: in the server's own
process they would stop its event loop, and every other request with it. So a body up to
IN_PROCESS_BYTES is answered in a thread of the server's own process (no copy), a larger one
by a worker process that loaded the same model at startup, its GIL its own. The worker takes
one request at a time, at the server's CPU priority (a lower one starved it); the memory
budget (rul.serving.admission) bounds how many wait for it (docs: Performance). A request's
deadline (the machine's monotonic clock) travels with it: its work stops at the deadline's next
check (rul.serving.deadline). A worker that dies is replaced; the requests it held get a 503.
The worker watches the server's process (rul.orphans): a server killed outright (SIGKILL) leaves
no worker, nor the scratch folders it names, nor the fork server's (which ends on its own).
"""

import asyncio
import contextlib
import ctypes
import multiprocessing
import multiprocessing.util
import os
import signal
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from rul.orphans import end_with
from rul.serving import deadline, served
from rul.serving.admission import RETRY_AFTER_S
from rul.serving.scoring import Answer, answer

IN_PROCESS_BYTES = 2**20
_model = None  # the worker process's model


def trim_memory() -> None:
    """Give the memory a request freed back to the system (glibc's malloc_trim)."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _load(path: str, server: int, folders: tuple[str, ...]) -> None:
    """The worker's start: its model loaded (read as data: rul.serving.served). Ctrl-C
    reaches the terminal's whole process group; the server ends this worker itself when it
    stops (no traceback of its own), and were it killed, the worker ends with it, removing
    `folders`."""
    global _model
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_with(server, folders)
    _model = served.Served(served.load(path))


def _ready() -> int:
    return os.getpid()


SOCKET_PATH_MAX = 107  # bytes in a Unix socket's path (sockaddr_un.sun_path, less its NUL)
_SOCKET_SUFFIX = len("/pymp-12345678/listener-12345678")


def _socket_folder_that_fits() -> None:
    """The fork server listens on a Unix socket in multiprocessing's temporary folder, made
    in TMPDIR on first use; under a TMPDIR too long for a socket's path, that folder is made in
    /tmp instead (as Python 3.13 does), not refused with `AF_UNIX path too long`."""
    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_SUFFIX <= SOCKET_PATH_MAX:
        return
    saved, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        multiprocessing.util.get_temp_dir()  # made once per process, removed at its exit
    finally:
        tempfile.tempdir = saved


def _answer(model, body: bytes, media: str, deadline_at: float) -> Answer:
    token = deadline.DEADLINE.set(deadline_at)
    try:
        return answer(model, body, media)
    finally:
        deadline.DEADLINE.reset(token)


def _work(body: bytes, media: str, deadline_at: float) -> Answer:
    try:
        return _answer(_model, body, media, deadline_at)
    finally:
        del body
        trim_memory()


class Lanes:
    """A worker process that loads the model from `path` (a local model folder), started at
    once; this process's `model` (the same one) is set by the caller. The worker is forked
    from a fork server that imported rul first (its start is then a fork, not an import).
    `scratch`: the server's folders a worker removes if the server is killed."""

    def __init__(self, path: str, scratch: tuple[str, ...] = ()):
        self.path, self.model = str(path), None
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["rul"])  # the package, found where this one is
        _socket_folder_that_fits()
        self.context = context
        # the fork server's folder (its socket) too: made here, where it listens
        self.leftovers = (*scratch, multiprocessing.util.get_temp_dir())
        self.pool = self._start()
        self.started = self.pool.submit(_ready)

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(1, mp_context=self.context, initializer=_load,
                                   initargs=(self.path, os.getpid(), self.leftovers))

    def wait_ready(self, seconds: float = 300) -> int:
        """Wait until the worker's model is loaded; its process id."""
        return self.started.result(timeout=seconds)

    def worker_pids(self) -> list[int]:
        return [p.pid for p in (self.pool._processes or {}).values()]

    async def run(self, body: bytes, media: str, deadline_at: float,
                  size: int | None = None) -> Answer:
        """The answer to `body`; `size`: the bytes it stands for (a Parquet body's decoded
        size; None: its own)."""
        if (len(body) if size is None else size) <= IN_PROCESS_BYTES:
            return await asyncio.to_thread(_answer, self.model, body, media, deadline_at)
        pool = self.pool
        try:
            return await asyncio.wrap_future(pool.submit(_work, body, media, deadline_at))
        except BrokenProcessPool:
            if self.pool is pool:  # the first to hear of it starts another
                pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self._start()
            return Answer.refusal(503, "server: the worker for large bodies stopped (out of "
                                       "memory?) and is restarting; retry",
                                  "TEMPORARILY_UNAVAILABLE", RETRY_AFTER_S)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

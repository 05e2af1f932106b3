"""A worker process never outlives the process it works for.

A process killed with SIGKILL (or dying of the out-of-memory killer) runs none of its own
clean-up: it cannot stop its workers nor remove its scratch folders. So each worker watches it
(`end_with`): a daemon thread waits for that process to end, on a pidfd (Linux 5.3+: readable
when the process has ended, whatever pid comes next) or, where there is none, by looking every
POLL_S seconds. When it has ended the worker removes the folders it names (the parent's
scratch folders, which it would have removed), then sends itself SIGTERM, as the parent would
have on a stop: a training or tuning worker's run ends KILLED saying so (rul.interrupts), a
server's worker ends at once. One still there GRACE_S later is killed.
"""

import os
import select
import shutil
import signal
import threading
import time

POLL_S = 1.0
GRACE_S = 120.0  # as rul.parallel.STOP_GRACE_S: what a stopped worker gets to end its run


def end_with(pid: int, folders: tuple[str, ...] = ()) -> threading.Thread:
    """In a worker: when process `pid` ends, however it ends, remove `folders` and stop this
    process (module docstring). Returns the watching thread (a daemon)."""
    watcher = threading.Thread(target=_watch, args=(pid, tuple(folders)), daemon=True,
                               name=f"end-with-{pid}")
    watcher.start()
    return watcher


def _watch(pid: int, folders: tuple[str, ...]) -> None:
    _wait_for_end(pid)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_end(pid: int) -> None:
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # ended already
    except (AttributeError, OSError):  # no pidfd here: look now and then
        while _alive(pid):
            time.sleep(POLL_S)
        return
    try:
        select.select([handle], [], [])
    finally:
        os.close(handle)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

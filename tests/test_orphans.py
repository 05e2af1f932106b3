"""A worker never outlives the process it works for (rul.orphans): its parent killed with
SIGKILL, which runs none of its clean-up, the worker removes the folders it was given and
ends within seconds; so do a batch's worker processes (rul.parallel), whose tasks once ran on
unsupervised. The server's worker and fork server: test_server_stop.py."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rul import orphans

ROOT = Path(__file__).resolve().parents[1]


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie no one reaps (a container's first process may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_gone(pids: list[int], seconds: float = 15) -> list[int]:
    deadline = time.monotonic() + seconds
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if not gone(p)]


def parent_of(child: str, tmp_path) -> tuple[subprocess.Popen, list[int]]:
    """A parent process that starts `child` (Python, {pid} its pid) and prints the pids of
    what it started, one a line, then `ready` and waits to be killed."""
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        {child}
        print("ready", flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=tmp_path)
    pids = []
    for line in parent.stdout:
        if line.strip() == "ready":
            return parent, pids
        pids.append(int(line))
    raise AssertionError(f"the parent ended: {parent.wait()}")


def test_a_worker_removes_its_parent_s_folders_and_ends_when_the_parent_is_killed(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "model").mkdir(parents=True)
    child = f"""
        code = ("import sys, time; sys.path.insert(0, {str(ROOT)!r}); "
                "from rul.orphans import end_with; "
                "end_with(%d, ({str(scratch)!r},)); print('watching', flush=True); "
                "time.sleep(600)") % os.getpid()
        worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        worker.stdout.readline()
        print(worker.pid, flush=True)
    """
    parent, (worker,) = parent_of(child, tmp_path)
    time.sleep(0.3)
    assert not gone(worker) and scratch.exists()  # the parent lives: the worker goes on
    parent.kill()
    parent.wait()
    assert wait_gone([worker], 30) == []  # seconds; longer on a loaded 2-core machine
    assert not scratch.exists()


def test_a_parent_ended_before_the_watch_began_is_seen_at_once():
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    started = time.monotonic()
    orphans._wait_for_end(ended.pid)
    assert time.monotonic() - started < 1


@pytest.mark.slow
def test_a_batch_s_workers_end_when_its_process_is_killed(tmp_path):
    """rul.parallel's spawned workers (the seeds of `make evaluate JOBS=2`, an ensemble's
    members; `rul tune`'s workers watch the same way): once they ran every task on alone."""
    child = """
        import functools, threading
        from rul import parallel
        def show():
            time.sleep(5)  # the workers started and watching
            for entry in os.listdir("/proc"):
                if entry.isdigit() and entry != str(os.getpid()):
                    try:
                        stat = open(f"/proc/{entry}/stat").read()
                    except OSError:
                        continue
                    if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                        print(entry, flush=True)
            print("ready", flush=True)
        threading.Thread(target=show, daemon=True).start()
        parallel.run_tasks([functools.partial(time.sleep, 600)] * 4, jobs=2)
    """
    parent, workers = parent_of(child, tmp_path)
    assert len(workers) >= 2, workers
    parent.kill()
    parent.wait()
    assert wait_gone(workers, 20) == []

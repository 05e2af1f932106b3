"""rul.parallel: tasks in worker processes, and a batch that ends early still lets this
process exit."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tasks too big for a pipe's buffer, the first one failing: the second worker is stopped with
# tasks still queued for it (what a Ctrl-C or a failed seed leaves in `rul evaluate --jobs 2`).
FAILING_BATCH = textwrap.dedent("""
    import functools
    from rul.parallel import run_tasks

    def task(payload, fail):
        if fail:
            raise ValueError("the first task fails")
        import time
        time.sleep(30)

    if __name__ == "__main__":
        tasks = [functools.partial(task, b"x" * 2**20, i == 0) for i in range(8)]
        try:
            run_tasks(tasks, jobs=2)
        except ValueError as error:
            print("raised:", error, flush=True)
""")


def test_a_batch_stopped_with_tasks_still_queued_lets_the_process_exit(tmp_path):
    """Seconds when it exits; without the fix it hung until killed (a generous timeout: three
    processes import torch on a busy machine)."""
    script = tmp_path / "batch.py"
    script.write_text(FAILING_BATCH)
    process = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        out, err = process.communicate(timeout=300)
    finally:  # hung: its workers too are stopped, none left behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, err[-2000:]
    assert out.strip() == "raised: the first task fails"


# The parent interrupted while a worker's task runs: the worker is stopped with the parent's
# own signal, so its records say what was done (Ctrl-C, or SIGTERM from a scheduler).
INTERRUPTED_BATCH = textwrap.dedent("""
    import functools, sys, time
    from pathlib import Path
    from rul.interrupts import Terminated
    from rul.parallel import run_tasks

    def task(i, folder):
        folder = Path(folder)
        if i == 0:  # ends once the other task runs, so that the parent is interrupted then
            while not (folder / "started").exists():
                time.sleep(0.05)
            return
        (folder / "started").write_text("")
        try:
            time.sleep(120)
        except KeyboardInterrupt as stop:
            (folder / "stopped").write_text(type(stop).__name__)
            raise

    def interrupted(kind, *_):
        raise Terminated() if kind == "sigterm" else KeyboardInterrupt()

    if __name__ == "__main__":
        kind, folder = sys.argv[1:]
        try:
            run_tasks([functools.partial(task, i, folder) for i in range(2)], jobs=2,
                      on_done=functools.partial(interrupted, kind))
        except KeyboardInterrupt as stop:
            print("interrupted:", type(stop).__name__, flush=True)
""")


@pytest.mark.parametrize(("kind", "said"), [("sigint", "KeyboardInterrupt"),
                                            ("sigterm", "Terminated")])
def test_an_interrupted_batch_stops_its_workers_with_its_own_signal(tmp_path, kind, said):
    script = tmp_path / "batch.py"
    script.write_text(INTERRUPTED_BATCH)
    process = subprocess.Popen([sys.executable, str(script), kind, str(tmp_path)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True,
                               env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        out, err = process.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert out.strip() == f"interrupted: {said}", err[-2000:]
    assert (tmp_path / "stopped").read_text() == said

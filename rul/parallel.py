"""Independent tasks (a seed's training, an ensemble member's) run side by side in worker
processes, the CPU threads split between them.

`run_tasks(tasks, jobs)` runs each task (a picklable callable taking no argument, e.g. a
functools.partial of a module-level function) and returns each one's result and wall time,
in the tasks' order, whatever order they finish in. With jobs=1 they run here, one after
another. With jobs=N > 1, N spawned processes take the next task as they come free; each
uses 1/N of this process's torch threads. A task's numbers depend on its own seeds, and on
the number of threads it computes with (floating-point sums are split differently), never on
the other tasks: N jobs give the same numbers as running the tasks one after another with
the same threads per task.

Failures end the whole batch as they would one after another: the first task's error is
raised here once the other workers have stopped (ended with SIGTERM: their runs end KILLED);
Ctrl-C or SIGTERM here stops every worker with the same signal, then raises here.
"""

import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
from collections.abc import Callable, Sequence

import torch

from rul.interrupts import exit_code, interrupts_as_exceptions, signal_of
from rul.orphans import end_with

STOP_GRACE_S = 120  # how long stopped workers get to end their runs


def threads_per_job(jobs: int) -> int:
    return max(1, torch.get_num_threads() // jobs)


def run_tasks(tasks: Sequence[Callable], jobs: int = 1,
              on_done: Callable[[int, object, float], None] | None = None
              ) -> list[tuple[object, float]]:
    """[(result, seconds)] of each task; `on_done(index, result, seconds)` as each ends."""
    jobs = max(1, min(jobs, len(tasks)))
    if jobs == 1:
        results = []
        for index, task in enumerate(tasks):
            started = time.perf_counter()
            results.append((task(), time.perf_counter() - started))
            if on_done is not None:
                on_done(index, *results[-1])
        return results
    return _in_processes(tasks, jobs, on_done)


def _in_processes(tasks, jobs, on_done) -> list[tuple[object, float]]:
    context = multiprocessing.get_context("spawn")
    todo, done = context.Queue(), context.Queue()
    for item in enumerate(tasks):
        todo.put(item)
    for _ in range(jobs):
        todo.put(None)
    workers = [context.Process(target=_worker, args=(todo, done, threads_per_job(jobs),
                                                     os.getpid()), daemon=True)
               for _ in range(jobs)]
    results: dict[int, tuple[object, float]] = {}
    try:
        for worker in workers:
            worker.start()
        while len(results) < len(tasks):
            index, error, result, seconds = _next_result(done, workers)
            if error is not None:
                raise error
            results[index] = (pickle.loads(result), seconds)
            if on_done is not None:
                on_done(index, *results[index])
    except BaseException as error:  # a task failed, or this process was signalled: stop the rest
        stop_workers(workers, error)
        # tasks no worker will take may still fill the queue's pipe: its feeder thread would
        # block this process's exit forever (hung after Ctrl-C), so it is not waited for
        todo.cancel_join_thread()
        raise
    for worker in workers:
        worker.join()
    return [results[i] for i in range(len(tasks))]


def _next_result(done, workers):
    while True:
        try:
            return done.get(timeout=1.0)
        except queue.Empty:
            if not any(w.is_alive() for w in workers) and done.empty():
                codes = [w.exitcode for w in workers]
                raise RuntimeError(f"every worker process ended before its tasks were done "
                                   f"(exit codes {codes})") from None


def stop_workers(workers, cause: BaseException) -> None:
    """Stop the live worker processes with the signal this one got (`cause` a Ctrl-C or a
    SIGTERM; SIGTERM for a failure) so that their runs end KILLED saying what was done, and
    give them STOP_GRACE_S to end. A worker already stopping ignores it."""
    signum = signal_of(cause) if isinstance(cause, KeyboardInterrupt) else signal.SIGTERM
    for worker in workers:
        if worker.is_alive():
            os.kill(worker.pid, signum)
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))


def use_threads(threads: int) -> None:
    """This worker process computes with `threads` torch threads, and so do the processes it
    starts."""
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def _worker(todo, done, threads: int, parent: int) -> None:
    """Take tasks until the sentinel; a signal ends the task's run KILLED, then the worker
    exits 130 or 143; so does the end of `parent` (this batch's process), however it ends
    (rul.orphans)."""
    end_with(parent)
    use_threads(threads)
    try:
        with interrupts_as_exceptions():
            while (item := todo.get()) is not None:
                index, task = item
                started = time.perf_counter()
                try:
                    result = pickle.dumps(task())  # here, so that a failure is this task's
                except Exception as error:
                    done.put((index, _picklable(error), None, 0.0))
                    return
                done.put((index, None, result, time.perf_counter() - started))
    except KeyboardInterrupt as interruption:
        sys.exit(exit_code(interruption))


def _picklable(error: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")

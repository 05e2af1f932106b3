"""Run the loops of `bench peers` (bench/peers/__init__.py), each in a process of its own, in
turns: every process prepares its inputs at once, then the turns go round, one loop training
one epoch (and validating) while the others wait, so that a machine busy with other work
slows every loop alike (as bench/speed.py interleaves its paths). The figures side by side,
as ratios to the plain loop."""

import multiprocessing
import os
import time

import torch

from bench.peers import LOOPS, PEERS, missing

REFERENCE = "plain"
COLUMNS = ["loop", "samples/s", "samples/s vs plain", "wall s", "wall vs plain", "val RMSE"]


class LoopProcess:
    """One loop's process (bench/peers/child.py) and the messages it sends: a turn asked for,
    its result, or the error that stopped it."""

    def __init__(self, loop: str, epochs: int, dry: bool, context, timeout_s: float):
        from bench.peers.child import serve

        self.loop, self.timeout_s, self.result = loop, timeout_s, None
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(loop, epochs, dry, child),
                                       daemon=True)
        self.process.start()
        child.close()

    def wait(self) -> None:
        """Until the loop asks for its next turn or ends; RuntimeError if it failed."""
        if not self.conn.poll(self.timeout_s):
            raise RuntimeError(f"bench peers: the {self.loop} loop gave no sign in "
                               f"{self.timeout_s:.0f} s")
        try:
            kind, value = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"bench peers: the {self.loop} loop's process died "
                               f"(exit {self.process.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"bench peers: the {self.loop} loop failed:\n{value}")
        if kind == "result":
            self.result = value

    def go(self) -> None:
        """Its turn: one epoch (its setup before the first); back when it asks for the next."""
        self.conn.send("go")
        self.wait()

    def close(self) -> None:
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


def run_loops(loops: list[str], epochs: int, dry: bool, timeout_s: float = 1800
              ) -> dict[str, dict]:
    """Each loop's result, trained in turns (one epoch a turn, `loops`' order)."""
    context = multiprocessing.get_context("spawn")
    running = []
    try:
        for loop in loops:
            running.append(LoopProcess(loop, epochs, dry, context, timeout_s))
        for process in running:
            process.wait()  # prepared: asks for its first turn
        for _ in range(epochs):
            for process in running:
                process.go()
        return {process.loop: process.result for process in running}
    finally:
        for process in running:
            process.close()


def rows_of(results: dict[str, dict]) -> list[list]:
    """One row per loop, its speed and wall time as ratios to the plain loop's."""
    plain = results[REFERENCE]
    return [[loop, round(r["samples_per_s"]),
             round(r["samples_per_s"] / plain["samples_per_s"], 2), round(r["wall_s"], 1),
             round(r["wall_s"] / plain["wall_s"], 2), round(r["val_rmse"], 2)]
            for loop, r in results.items()]


def rul_vs_fastest_peer(results: dict[str, dict]) -> tuple[str, float]:
    """(the fastest peer that ran, rul's samples/s over its)."""
    peer = max((loop for loop in results if loop in PEERS),
               key=lambda loop: results[loop]["samples_per_s"])
    return peer, results["rul"]["samples_per_s"] / results[peer]["samples_per_s"]


def chosen_loops() -> tuple[list[str], list[str]]:
    """(the loops to run here, the peers skipped as not installed), saying so in one line
    each. The plain loop with rul's malloc settings runs on a CPU only."""
    loops, skipped = [], []
    for loop in LOOPS:
        if loop == "plain, rul's malloc" and torch.cuda.is_available():
            continue
        package = missing(loop)
        if package:
            print(f"peers: {loop} skipped: {package} is not installed "
                  "(pip install -e '.[peers]')")
            skipped.append(loop)
        else:
            loops.append(loop)
    return loops, skipped


def bench_peers(epochs: int = 5, dry: bool = False) -> dict:
    if dry:
        epochs = 2
    loops, skipped = chosen_loops()
    started, load = time.perf_counter(), os.getloadavg()[0]
    results = run_loops(loops, epochs, dry)
    load = f"load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    first = results[REFERENCE]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    where = (f"{first['device']} {first['precision']}, {first['optimizer']}, {epochs} epochs "
             f"of {first['windows']} "
             f"windows{' (dry run: 10 engines, a tiny DCNN)' if dry else ''}, "
             f"{torch.get_num_threads()} CPU threads ({load} over {os.cpu_count()} CPUs), "
             f"{gpu}, torch {torch.__version__}")
    print(f"peers: {where}; {time.perf_counter() - started:.0f} s in all")
    rows = rows_of(results)
    print(f"{COLUMNS[0]:20} " + " ".join(f"{c:>18}" for c in COLUMNS[1:]))
    for row in rows:
        print(f"{row[0]:20} " + " ".join(f"{v:>18}" for v in row[1:]))
    peer, ratio = rul_vs_fastest_peer(results)
    print(f"peers: rul vs the fastest peer ({peer}): {ratio:.2f}x samples/s")
    return {"columns": COLUMNS, "rows": rows,
            "summary": {"rul vs the fastest peer (samples/s)": f"{ratio:.2f}x ({peer})",
                        "optimizer": first["optimizer"], "precision": first["precision"],
                        "device": first["device"],
                        "epochs": epochs, **({"skipped": ", ".join(skipped)} if skipped
                                             else {})},
            "note": f"{where}; one run, each loop in its own process, in turns of one epoch; "
                    "samples/s over every epoch but the first, validation excluded; wall: "
                    "the framework's setup, every epoch and its validation (imports, data "
                    "preparation and waiting for a turn excluded)",
            "loops": results}

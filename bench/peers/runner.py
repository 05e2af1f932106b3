"""Run every loop of `bench peers` (bench/peers/__init__.py) in a process of its own, one
after another, and put their figures side by side as ratios to the plain loop."""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.peers import LOOPS, missing
from bench.peers.common import ROOT

REFERENCE = "plain"
COLUMNS = ["loop", "samples/s", "samples/s vs plain", "wall s", "wall vs plain", "val RMSE"]


def run_loop(loop: str, epochs: int, dry: bool, timeout_s: float = 1800) -> dict:
    """`loop`'s result from a fresh process (bench/peers/child.py); RuntimeError with its
    last lines when it fails."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        args = [sys.executable, "-m", "bench.peers.child", loop, "--epochs", str(epochs),
                "--out", str(out)] + (["--dry-run"] if dry else [])
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not out.is_file():
            said = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"bench peers: the {loop} loop failed (exit {done.returncode}):"
                               f"\n{said}")
        return json.loads(out.read_text())


def rows_of(results: dict[str, dict]) -> list[list]:
    """One row per loop, its speed and wall time as ratios to the plain loop's."""
    plain = results[REFERENCE]
    return [[loop, round(r["samples_per_s"]),
             round(r["samples_per_s"] / plain["samples_per_s"], 2), round(r["wall_s"], 1),
             round(r["wall_s"] / plain["wall_s"], 2), round(r["val_rmse"], 2)]
            for loop, r in results.items()]


def rul_vs_fastest_peer(results: dict[str, dict]) -> tuple[str, float]:
    """(the fastest other loop, rul's samples/s over its)."""
    peer = max((loop for loop in results if loop != "rul"),
               key=lambda loop: results[loop]["samples_per_s"])
    return peer, results["rul"]["samples_per_s"] / results[peer]["samples_per_s"]


def bench_peers(epochs: int = 5, dry: bool = False) -> dict:
    if dry:
        epochs = 2
    results, skipped = {}, []
    for loop in LOOPS:
        package = missing(loop)
        if package:
            print(f"peers: {loop} skipped: {package} is not installed "
                  "(pip install -e '.[peers]')")
            skipped.append(loop)
            continue
        started = time.perf_counter()
        results[loop] = run_loop(loop, epochs, dry)
        print(f"peers: {loop} done in {time.perf_counter() - started:.0f} s "
              "(its process, imports and data included)", flush=True)
    first = results[REFERENCE]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    where = (f"{first['device']} {first['precision']}, {epochs} epochs of {first['windows']} "
             f"windows{' (dry run: 10 engines, a tiny DCNN)' if dry else ''}, "
             f"{torch.get_num_threads()} CPU threads, {gpu}, torch {torch.__version__}")
    print(f"peers: {where}")
    rows = rows_of(results)
    print(f"{COLUMNS[0]:11} " + " ".join(f"{c:>18}" for c in COLUMNS[1:]))
    for row in rows:
        print(f"{row[0]:11} " + " ".join(f"{v:>18}" for v in row[1:]))
    peer, ratio = rul_vs_fastest_peer(results)
    print(f"peers: rul vs the fastest other loop ({peer}): {ratio:.2f}x samples/s")
    return {"columns": COLUMNS, "rows": rows,
            "summary": {"rul vs fastest other loop (samples/s)": f"{ratio:.2f}x ({peer})",
                        "precision": first["precision"], "device": first["device"],
                        "epochs": epochs, **({"skipped": ", ".join(skipped)} if skipped
                                             else {})},
            "note": f"{where}; one run, each loop in its own process, one after another; "
                    "samples/s over every epoch but the first, validation excluded; wall: "
                    "the framework's setup, every epoch and its validation (imports and data "
                    "preparation excluded)",
            "loops": results}

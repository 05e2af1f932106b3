"""The CPU training fingerprint: what a refactor must leave bitwise unchanged.

    python tools/fingerprint.py > before.json   # on the commit before the change
    python tools/fingerprint.py > after.json    # after it
    cmp before.json after.json

For the default and the age configs (3 epochs, fp32) and a 2-member ensemble: the SHA-256 of
the trained weights, of every epoch's metrics (timings left out), of every step's gradient
norm, of the test predictions and of the interval. Untracked (no MLflow), one thread, on the
C-MAPSS files that `rul train` finds (CMAPSS_DIR, ../shared/cmapss).
"""

import hashlib
import json
import sys

import numpy as np
import torch

from rul import config as cfg
from rul.plan import plan_ensemble, plan_run
from rul.training.run import train

CASES = {"default": ("experiments/fd001.yaml", []),
         "age": ("experiments/fd001_age.yaml", []),
         "ensemble2": ("experiments/fd001.yaml", ["ensemble=2"])}
COMMON = ["epochs=3", "precision=fp32", "register=false"]
TIMINGS = ("samples_per_s", "epoch_seconds", "seconds", "peak_memory_mb")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def _tensor_digest(tensors: dict) -> str:
    sha = hashlib.sha256()
    for name in sorted(tensors):
        sha.update(name.encode())
        sha.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return sha.hexdigest()


def fingerprint_of(outcome) -> dict:
    history = [{k: v for k, v in epoch.items() if k not in TIMINGS}
               for epoch in outcome.state.history]
    predictions = outcome.predictions.to_numpy(dtype=np.float64)
    return {"weights": _tensor_digest(outcome.model.state_dict()),
            "history": _digest(history),
            "grad_norms": _digest([float(g) for g in outcome.state.grad_norms]),
            "predictions": hashlib.sha256(predictions.tobytes()).hexdigest(),
            "metrics": {k: float(v) for k, v in sorted(outcome.metrics.items())},
            "interval": repr(outcome.interval)}


def main() -> None:
    torch.set_num_threads(1)
    result = {}
    for name, (path, extra) in CASES.items():
        config = cfg.load(path, COMMON + extra)
        plans = plan_ensemble(config).members if config.ensemble > 1 else [plan_run(config)]
        result[name] = [fingerprint_of(train(plan, progress=False)) for plan in plans]
        print(f"{name}: {[r['weights'][:12] for r in result[name]]}", file=sys.stderr)
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()

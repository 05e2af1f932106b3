"""`python -m bench peers`: the same training by rul's loop and by the loops a user would
pick instead, each in a process of its own, in one run.

  rul         rul.training.engine.fit, as `rul train` runs it (bench/peers/rul_loop.py)
  plain       a hand-written loop in nanoGPT's style (bench/peers/plain_loop.py): the reference
  lightning   PyTorch Lightning's Trainer (bench/peers/lightning_loop.py)
  accelerate  Hugging Face Accelerate (bench/peers/accelerate_loop.py)
  plain, rul's malloc   the plain loop with glibc's malloc set as `rul train` sets it on a
              CPU (bench/peers/plain_kept_loop.py; CPU only): rul's loop told from its
              allocator settings

The loops train in turns of one epoch, each in its own process (bench/peers/runner.py).
Every loop trains `make train`'s recipe (its DCNN, its optimizer: Muon with AdamW) on the same
prepared FD001 windows, from the same initial weights, with the same micro-batches in the same
order (256 x K=2), its schedule, clipping at 1.0 and the precision `rul train` resolves on
this machine, for the same epochs; the weight average is off and nothing stops early
(bench/peers/common.py). Only the loop differs. Lightning and Accelerate come with the
optional extra `pip install -e '.[peers]'`; a peer that is not installed is skipped with one
line. Figures: steady samples/s (every epoch but the first, validation excluded) and wall time
(the framework's setup, every epoch and its validation), each as a ratio to the plain loop,
and the validation RMSE each loop's last weights reach (rul.training.predict.validation_rmse).
"""

import importlib.util

LOOPS = {"plain": "bench.peers.plain_loop", "rul": "bench.peers.rul_loop",
         "lightning": "bench.peers.lightning_loop", "accelerate": "bench.peers.accelerate_loop",
         "plain, rul's malloc": "bench.peers.plain_kept_loop"}
PEERS = ("plain", "lightning", "accelerate")  # what a user would pick instead of rul's loop
NEEDS = {"lightning": "lightning", "accelerate": "accelerate"}  # the peers extra's packages


def missing(loop: str) -> str | None:
    """The package `loop` needs and this environment lacks, or None."""
    package = NEEDS.get(loop)
    return package if package and importlib.util.find_spec(package) is None else None

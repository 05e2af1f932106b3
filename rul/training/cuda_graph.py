"""A sync-free training step captured once in a CUDA graph per batch size and replayed.

An optimizer step of the DCNN launches a few hundred small kernels, and on a GPU launching
them costs more than their arithmetic. Captured, the whole step (the micro-batches' gathers,
forwards and backwards, unscale, the overflow check, clipping, the optimizer's update: fused
AdamW's or Muon's, the scaler's update, the schedule, the weight average and the step's
record) is one launch. Only a step that decides on the device can be captured
(rul.training.sync_free): nothing in it reads a value back. A replay runs the same kernels
in the same order on the same addresses as the eager step, so it computes the same numbers.
An epoch has two batch sizes, the effective batch and its last, shorter one (the same every
epoch): each gets its graph, captured after it ran eagerly `WARMUP` times (which creates the
optimizer's and the scaler's state and settles the libraries' lazy initialisation), each
with its own memory pool.
"""

import os

import torch

WARMUP = 2
# RUL_CUDA_GRAPHS=0 runs every step eagerly (the same numbers, slower): for debugging, and
# for `make gpu-check`, which compares the two.
ENABLED = os.environ.get("RUL_CUDA_GRAPHS", "1") != "0"


class _Captured:
    def __init__(self, size: int, device: torch.device):
        self.indices = torch.zeros(size, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.row: torch.Tensor | None = None
        self.eager = 0


class GraphedStep:
    """A step run eagerly `WARMUP` times per number of indices, then captured for it and
    replayed. `eager(indices) -> row` and `captured(indices) -> row` compute the same step
    (a row: a 1-d tensor on the device, the step's packed record); `eager` may back off after
    running out of memory (training.backoff), `captured` reads nothing back."""

    def __init__(self, eager, captured, device: torch.device):
        self.eager, self.step, self.device = eager, captured, device
        self.sizes: dict[int, _Captured] = {}

    def __call__(self, indices: torch.Tensor) -> torch.Tensor:
        size = self.sizes.setdefault(len(indices), _Captured(len(indices), self.device))
        if size.graph is None:
            if size.eager < WARMUP:
                size.eager += 1
                return self.eager(indices)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # records the kernels; nothing runs until replay
                size.row = self.step(size.indices)
            size.graph = graph
        size.indices.copy_(indices)
        size.graph.replay()
        return size.row.clone()

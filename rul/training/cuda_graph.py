"""A sync-free training step captured once in a CUDA graph and replayed for every full
effective batch.

An optimizer step of the DCNN launches a few hundred small kernels, and on a GPU launching
them costs more than their arithmetic. Captured, the whole step (the micro-batches' gathers,
forwards and backwards, unscale, the overflow check, clipping, the fused AdamW update, the
scaler's update, the schedule, the weight average and the step's record) is one launch. Only
a step that decides on the device can be captured (rul.training.sync_free): nothing in it
reads a value back. A replay runs the same kernels in the same order on the same addresses as
the eager step, so it computes the same numbers; the epoch's last, shorter batch (another
shape) runs eagerly, and so do the first `WARMUP` steps, which create the optimizer's and the
scaler's state and settle the libraries' lazy initialisation before the capture.
"""

import os

import torch

WARMUP = 2
# RUL_CUDA_GRAPHS=0 runs every step eagerly (the same numbers, slower): for debugging, and
# for `make gpu-check`, which compares the two.
ENABLED = os.environ.get("RUL_CUDA_GRAPHS", "1") != "0"


class GraphedStep:
    """`step(indices) -> row` (a 1-d tensor on the device, the step's packed record), run
    eagerly `WARMUP` times, then captured for batches of `batch_size` indices and replayed."""

    def __init__(self, step, batch_size: int, device: torch.device):
        self.step = step
        self.indices = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.row: torch.Tensor | None = None
        self.eager = 0

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, indices: torch.Tensor) -> torch.Tensor:
        if len(indices) != len(self.indices):
            return self.step(indices)
        if self.graph is None:
            if self.eager < WARMUP:
                self.eager += 1
                return self.step(indices)
            self._capture()
        self.indices.copy_(indices)
        self.graph.replay()
        return self.row.clone()

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records the kernels; nothing runs until replay
            self.row = self.step(self.indices)
        self.graph = graph

"""Out-of-memory back-off that keeps the effective batch: one optimizer step over an effective
batch's sample indices, split into micro-batches of the current size; if a micro-batch runs out
of memory, the partial gradients are dropped, the micro-batch is halved (K doubles, B stays),
the random streams are put back and the same effective batch is redone from its start.

The samples, their order and the step's sample weighting do not change, so the run goes on
exactly as a run that used the smaller micro-batch from the start: no step lost, none doubled.
The GradScaler is untouched by a failed forward/backward (it only unscales and steps after
every micro-batch's backward). Out-of-memory at micro-batch size 1 is raised as it is.
Limit: an error inside the optimizer's own update (after the micro-batches; rare, since its
state is allocated on the first step) would be retried on partly updated weights.
"""

import math

import torch

from rul.training.distributed import rank_share
from rul.training.seeding import RandomState
from rul.training.step import StepResult, StepSettings, optimizer_step


class BackoffStep:
    """`optimizer_step` over `data`'s samples of one effective batch, in micro-batches of the
    current size (halved after an out-of-memory error), with the run's `settings`."""

    def __init__(self, data, settings: StepSettings, micro_batch_size: int,
                 effective_batch_size: int):
        self.data, self.settings = data, settings
        self.micro_batch_size = micro_batch_size
        self.effective_batch_size = effective_batch_size
        self.backoffs: list[tuple[int, int]] = []  # (micro, K) after each halving

    @property
    def accumulation_steps(self) -> int:
        return math.ceil(self.effective_batch_size / self.micro_batch_size)

    def __call__(self, model, optimizer, scaler, indices: torch.Tensor,
                 global_total: int | None = None) -> StepResult:
        """`indices`: this rank's share of one effective batch; `global_total`: the batch's
        samples over all ranks (DDP weights each micro-batch by its global share)."""
        device = self.settings.precision.device
        random_state = RandomState(device)
        while True:
            try:
                return self.attempt(model, optimizer, scaler, indices, global_total)
            except torch.OutOfMemoryError:
                if self.micro_batch_size == 1:
                    raise
                optimizer.zero_grad(set_to_none=True)  # drop the partial gradients
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                random_state.restore()
                self.micro_batch_size //= 2
                self.backoffs.append((self.micro_batch_size, self.accumulation_steps))

    def attempt(self, model, optimizer, scaler, indices: torch.Tensor,
                global_total: int | None = None) -> StepResult:
        """The step at the current micro-batch size, once, with no back-off (what a CUDA
        graph captures: it reads no random state back)."""
        micro_batches, weights = rank_share(  # stacked members: (members, batch) indices
            self.data, list(indices.split(self.micro_batch_size, dim=-1)),
            global_total or indices.shape[-1], self.settings.world_size)
        return optimizer_step(model, optimizer, scaler, micro_batches, self.settings, weights)

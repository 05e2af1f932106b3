"""What follows a step that decided on the device (CUDA): the schedule, the weight average
and the step's record, kept on the GPU so that the loop never waits for it.

A host step knows whether it was skipped and steps the scheduler and the weight average only
when the optimizer stepped (optim.TrainingParts). A sync-free step leaves `skipped` a tensor
on the GPU. Here the same rules are applied there:

- the learning rate of the n-th real step is a table lookup, n being a counter on the device;
  the table is the run's own scheduler stepped on the host once (so the very rates a host run
  uses), and the host scheduler is brought to the counter once per epoch, for checkpoints;
- the weight average moves by (1 - d) x taken, taken being 0 for a skipped step (nothing
  moves), with d and the first update's copy as AveragedModel and optim.ema_with_warmup
  do;
- each step's StepResult is packed into one row on the device and read once per epoch.
"""

import warnings

import torch

from rul.training.step import StepResult


class DeviceSchedule:
    """A scheduler's rates on the device, picked by the number of steps taken so far."""

    def __init__(self, optimizer, make_scheduler, total_steps: int, lr: float):
        """`make_scheduler(host_optimizer)` makes the run's scheduler on a host-only optimizer
        of the starting rate `lr` (the config's number: the tensor holds it in its dtype): one
        is stepped through the table, the other's state is what a checkpoint keeps.
        `optimizer` is the one whose lr tensor is set; the table is in that tensor's dtype
        (MuonAdamW's float64 holds the host's rates bit for bit)."""
        rate = optimizer.param_groups[0]["lr"]
        self.optimizer, self.scheduler = optimizer, make_scheduler(host_optimizer(lr))
        table, rates = make_scheduler(host_optimizer(lr)), []
        with warnings.catch_warnings():  # its optimizer never steps: torch warns about that
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(total_steps + 1):
                rates.append(table.get_last_lr()[0])
                table.step()
        self.rates = torch.tensor(rates, dtype=rate.dtype, device=rate.device)
        self.taken = torch.zeros((), dtype=torch.long, device=rate.device)  # real steps so far
        for group in optimizer.param_groups:  # the first step's rate (a warm-up's is < lr)
            group["lr"].copy_(self.rates[0])

    def after_step(self, skipped: torch.Tensor) -> None:
        self.taken += (~skipped).long()
        at = self.taken.clamp(max=len(self.rates) - 1).view(1)
        rate = self.rates.index_select(0, at).view(())  # rates[tensor] would read it back
        for group in self.optimizer.param_groups:
            group["lr"].copy_(rate)

    def sync(self) -> None:
        """Step the host scheduler to the device's count (reads one number)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(int(self.taken) - self.scheduler.last_epoch):
                self.scheduler.step()

    def loaded(self) -> None:
        """After the host scheduler's state was loaded: the count and the rate follow it."""
        self.taken.fill_(self.scheduler.last_epoch)
        for group in self.optimizer.param_groups:
            group["lr"].copy_(self.rates[min(self.scheduler.last_epoch, len(self.rates) - 1)])


def host_optimizer(lr: float) -> torch.optim.Optimizer:
    """An optimizer of one host number that only carries the learning rate for a scheduler
    (all a scheduler reads and writes: lr, initial_lr)."""
    return torch.optim.SGD([torch.zeros(1)], lr=lr)


@torch.no_grad()
def average_on_device(average, model, skipped: torch.Tensor, decay: float) -> None:
    """AveragedModel.update_parameters with ema_with_warmup's rule, computed on the device
    and moved by nothing when the step was skipped: w <- lerp(w, current, (1 - d) x taken),
    d = min(decay, (1 + n) / (10 + n)), the first real update a copy (lerp with weight 1)."""
    n = average.n_averaged
    rising = (1 + n.double()) / (10 + n.double())
    weight = torch.where(n == 0, 1.0, 1 - torch.clamp(rising, max=decay)).float()
    weight = weight * (~skipped).float()
    averaged = [*average.module.parameters(), *average.module.buffers()]
    current = [*model.parameters(), *model.buffers()]
    for a, c in zip(averaged, current, strict=True):
        if a.is_floating_point():
            a.lerp_(c.detach(), weight)
        else:
            a.copy_(torch.where(weight > 0, c, a))
    n += (~skipped).long()


class StepLog:
    """One epoch's step records on the device, read with one copy at its end."""

    def __init__(self):
        self.rows: list[torch.Tensor] = []

    def add(self, result: StepResult, device: torch.device) -> None:
        self.rows.append(result.packed(device))

    def read(self) -> list[StepResult]:
        if not self.rows:
            return []
        rows = torch.stack(self.rows).cpu().tolist()
        self.rows = []
        return [StepResult.unpacked(row) for row in rows]

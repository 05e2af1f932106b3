"""Members of one architecture trained at once: their weights stacked, one step for them all.

An ensemble's members on one shared split (rul.plan.plan_ensemble) differ only in their seed.
Trained one after the other on a GPU, each small step is bound by kernel launches, not
arithmetic. Stacked (torch.func.stack_module_state), one vmapped forward and backward per
micro-batch and one AdamW step carry every member: N members for the launches of one. On a
CPU, where the arithmetic sets the time, stacking is slower than one member after the other
(the DCNN's banded products do not stack; python -m bench members, 5 members: 49.9 s
stacked, 35.0 s one after another in fp32, 24.7 s in bf16).

Each member keeps what makes it itself: its initial weights (built from its own seed), its
batch order (its shuffle seed), its gradient norm and clipping, its weight average and its
early stopping (a member that has stopped still computes, unread, until the last one stops).
They share the data, the config and the learning-rate schedule (one step count), so a step
is never skipped for one member alone: a member whose gradient is not finite (recorded as
skipped) takes it, its weights turn NaN and it stops early on its best weights.

What differs from training each alone: float rounding (vmap's batched kernels; the DCNN takes
its convolutions, not its CPU banded products: rul.models.stacking), and dropout's masks,
which vmap draws for all members from one generator: the same distribution, other draws. With
dropout 0 each member is the one trained alone within float rounding (tests/test_stacked.py).

`stacking_problem` says why members cannot be stacked: a kind whose layers vmap does not
batch (NETWORK_KINDS' `stacks`), a precision other than fp32 (torch's autocast does not reach
inside vmap: bf16 or fp16 members would silently train in fp32; fp16's GradScaler would also
skip steps for all members at once), members on different data (folds) or configs, a resumed
or distributed run.
"""

import copy
import math
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from rul.errors import ConfigError
from rul.models.spec import NETWORK_KINDS
from rul.training.batching import WindowBatches, effective_batches
from rul.training.distributed import global_batch_size
from rul.training.engine import TrainState, epoch_metrics
from rul.training.listener import TrainingListener
from rul.training.optim import ema_with_warmup, make_scheduler, steps_per_epoch
from rul.training.run import TrainingOutcome, outcome_of
from rul.training.seeding import seed_everything
from rul.training.step import StepResult, StepSettings


def stacking_problem(plans: list) -> str | None:
    """Why the members of `plans` (RunPlans) cannot train stacked; None when they can."""
    first = plans[0]
    same = first.config.replace(seed=0)
    precision, asked = first.precision.name, first.config.precision
    checks = [
        (len(plans) < 2, "one member"),
        (not NETWORK_KINDS[first.config.model].stacks,
         f"model={first.config.model}: vmap does not batch its layers"),
        (any(p.data is not first.data for p in plans), "the members train on different data"),
        (any(p.config.replace(seed=0) != same for p in plans[1:]),
         "the members' configs differ in more than their seed"),
        (any(p.resume is not None for p in plans), "a member resumes a checkpoint"),
        (any(p.world.size > 1 for p in plans), "a distributed run"),
        (precision != "fp32",  # last: the one a user fixes with a key
         f"precision={asked}{f' picks {precision} here' if asked != precision else ''}: "
         "autocast does not reach inside vmap (the members would train in fp32; "
         "precision=fp32 stacks)"),
    ]
    return next((reason for failed, reason in checks if failed), None)


# What `python -m bench members` measured on a 2-core CPU with native bf16 (3 epochs of the
# default recipe's DCNN, 5 members), the figure `ensemble_training: auto`'s reason quotes there.
CPU_MEASURED = ("5 members: 49.9 s stacked, 35.0 s one after another in fp32, 24.7 s at "
                "precision auto's bf16")


@dataclass(frozen=True)
class MemberTraining:
    """How an ensemble's members train, and why (the parent run's ensemble.training tags)."""

    stacked: bool
    reason: str
    note: str | None = None  # one line for the user before training (stacked on a CPU)

    @property
    def name(self) -> str:
        return "stacked" if self.stacked else "sequential"


def member_training(asked: str, plans: list, jobs: int = 1) -> MemberTraining:
    """`ensemble_training` (`asked`) for the members `plans`, trained `jobs` at a time:
    sequential or stacked as asked (ConfigError when they cannot stack, or --jobs splits
    them over processes), or `auto`: sequential on every device so far. On a CPU stacking is
    slower than one member after another (CPU_MEASURED); on a GPU `make gpu-check` measures
    it (docs: Performance)."""
    problem = stacking_problem(plans) or (f"--jobs {jobs} trains them in separate processes"
                                          if jobs > 1 else None)
    if asked == "stacked":
        if problem:
            raise ConfigError(f"ensemble_training=stacked: the members cannot train stacked: "
                              f"{problem}")
        slower = (f"ensemble_training=stacked on a CPU: slower than one member after another "
                  f"({CPU_MEASURED}); ensemble_training=auto trains them so here"
                  if plans[0].device.type == "cpu" else None)
        return MemberTraining(True, "asked for", slower)
    if asked == "sequential":
        return MemberTraining(False, "asked for")
    if plans[0].device.type == "cpu":
        return MemberTraining(False, f"auto: on a CPU stacked members are slower than one after "
                                     f"another ({CPU_MEASURED})")
    if problem:
        return MemberTraining(False, f"auto: cannot stack ({problem})")
    return MemberTraining(False, f"auto: stacking is not measured on {plans[0].device.type} "
                                 "(ensemble_training=stacked opts in)")


def build_members(plans: list) -> list[nn.Module]:
    """Each member's network, initialized from its own seed as training it alone would; the
    global generators are then seeded by the first member's seeds (dropout's masks)."""
    models = []
    for plan in plans:
        seed_everything(plan.seeds, plan.config.deterministic)
        models.append(plan.network.build().to(plan.device))
    seed_everything(plans[0].seeds, plans[0].config.deterministic)
    return models


@dataclass
class StackedStep:
    """One stacked optimizer step's values, one per member, on the device until read."""

    loss: torch.Tensor  # (members,) sample-weighted mean loss over the effective batch
    grad_norm: torch.Tensor  # (members,) before clipping
    lr: float


def read_steps(steps: list[StackedStep], max_grad_norm: float | None
               ) -> list[list[StepResult]]:
    """Each step's StepResult per member, read from the device at once (one wait)."""
    if not steps:
        return []
    values = torch.stack([torch.stack([s.loss, s.grad_norm]) for s in steps]).tolist()
    return [[StepResult(loss, norm, max_grad_norm is not None and norm > max_grad_norm,
                        not math.isfinite(norm), step.lr, 1.0)
             for loss, norm in zip(losses, norms, strict=True)]
            for step, (losses, norms) in zip(steps, values, strict=True)]


class StackedMembers:
    """The members' weights as one stack: its step, weight average and validation."""

    def __init__(self, models: list[nn.Module], config, total_steps: int):
        self.models = models
        self.params, _ = stack_module_state(models)  # leaves, (members, ...) each
        # buffers (the output scale) are the config's, the same for every member: not stacked
        self.buffers = {name: b.detach().clone() for name, b in models[0].named_buffers()}
        self.base = copy.deepcopy(models[0]).to("meta")  # the architecture, without storage
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=config.lr,
                                           weight_decay=config.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, config, total_steps)
        self.ema = ema_with_warmup(config.ema_decay) if config.ema_decay else None
        self.average: dict | None = None  # the weight average (optim.weight_average's rule)
        self.averaged = 0

    def __len__(self) -> int:
        return len(self.models)

    def _forward(self, params: dict, x: torch.Tensor, shared_input: bool = False):
        def member(p, b, x):
            return functional_call(self.base, (p, b), (x,))
        return vmap(member, in_dims=(0, None, None if shared_input else 0),
                    randomness="different")(params, self.buffers, x)

    def step(self, batches: list[torch.Tensor], data: WindowBatches, settings: StepSettings,
             micro_batch_size: int) -> StackedStep:
        """One optimizer step of every member over its own effective batch of `data`'s
        indices (equal sizes), as step.optimizer_step takes it alone: each micro-batch's mean
        loss weighted by its share, the gradient clipped to max_grad_norm per member."""
        self.base.train()
        scale, total = settings.target_scale, len(batches[0])
        lr = self.optimizer.param_groups[0]["lr"]
        loss_sum = torch.zeros(len(self), device=batches[0].device)
        for parts in zip(*(b.split(micro_batch_size) for b in batches), strict=True):
            pairs = [data.get(indices) for indices in parts]
            x, y = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
            predicted = self._forward(self.params, x)  # fp32 (stacking_problem)
            loss = nn.functional.mse_loss(predicted.float() / scale, y / scale,
                                          reduction="none").mean(dim=1)
            weighted = loss * (len(parts[0]) / total)
            weighted.sum().backward()  # each member's gradient is its own loss's
            loss_sum += weighted.detach()
        grads = [p.grad for p in self.params.values()]
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads]), dim=0)
        if settings.max_grad_norm is not None:  # clip_grad_norm_'s rule, per member
            coef = (settings.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
            for g in grads:
                g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        self._update_average()
        return StackedStep(loss_sum, norms, lr)

    @torch.no_grad()
    def _update_average(self) -> None:
        """optim.ema_with_warmup over the stack; the first update copies the weights (as
        torch's AveragedModel does)."""
        if self.ema is None:
            return
        if self.average is None:
            self.average = {name: t.detach().clone() for name, t in self.params.items()}
        else:
            self.ema(list(self.average.values()), list(self.params.values()),
                     torch.tensor(self.averaged))
        self.averaged += 1

    @property
    def evaluated(self) -> dict:
        """The stacked parameters validation reads: the average when there is one."""
        return self.params if self.average is None else self.average

    @torch.inference_mode()
    def validation_rmse(self, val: WindowBatches, batch_size: int = 4096) -> list[float]:
        """Each member's RMSE over `val` (float64), its evaluated weights in float32."""
        self.base.eval()
        predicted = torch.cat([self._forward(self.evaluated, x, shared_input=True).float()
                               for x, _ in val.in_order(batch_size)], dim=1)
        error = predicted.double() - val.targets.double()
        return error.square().mean(dim=1).sqrt().tolist()

    def member_state(self, index: int) -> dict:
        """Member `index`'s evaluated weights as its network's state dict."""
        return {**{name: t[index].detach().clone() for name, t in self.evaluated.items()},
                **{name: b.clone() for name, b in self.buffers.items()}}


class _MemberWeights:
    """What TrainState.end_epoch keeps of a member: its state dict."""

    def __init__(self, stack: StackedMembers, index: int):
        self.stack, self.index = stack, index

    def state_dict(self) -> dict:
        return self.stack.member_state(self.index)


def fit_members(models: list[nn.Module], plans: list,
                listeners: list[TrainingListener | None] | None = None,
                progress: bool = False) -> list[TrainState]:
    """Train the members `models` of `plans` at once (stacking_problem must be None), each
    with early stopping on its validation RMSE; return their states, each model holding its
    best weights. Member i's listeners[i] hears its steps and epochs, as it would alone, at
    each epoch's end (until it stops early); `progress`: a bar and one line per epoch."""
    problem = stacking_problem(plans)
    if problem is not None:
        raise ValueError(f"members cannot train stacked: {problem}")
    plan, config = plans[0], plans[0].config
    train, val = WindowBatches(plan.data.train, plan.device), WindowBatches(plan.data.val,
                                                                            plan.device)
    batch_size = config.effective_batch_size
    per_epoch = steps_per_epoch(len(train), batch_size)
    stack = StackedMembers(models, config, config.epochs * per_epoch)
    settings = StepSettings.of(config, plan.precision)
    split = (config.micro_batch_size, config.accumulation_steps)
    states = [TrainState() for _ in plans]
    listeners = [listener or TrainingListener() for listener in listeners or [None] * len(plans)]
    for epoch in range(config.epochs):
        if all(state.bad_epochs >= config.patience for state in states):
            break
        started = time.perf_counter()
        orders = [effective_batches(len(train), batch_size, p.seeds.shuffle, epoch,
                                    device=plan.device) for p in plans]
        bar = tqdm(zip(*orders, strict=True), total=per_epoch, disable=not progress,
                   leave=False, unit="step",
                   desc=f"epoch {epoch + 1}/{config.epochs}, {len(plans)} members stacked")
        steps = [stack.step(list(indices), train, settings, config.micro_batch_size)
                 for indices in bar]
        sizes = [global_batch_size(len(train), batch_size, i) for i in range(len(steps))]
        per_step = read_steps(steps, config.max_grad_norm)  # one read per epoch
        seconds = time.perf_counter() - started
        val_rmse = stack.validation_rmse(val)
        for index, (state, listener) in enumerate(zip(states, listeners, strict=True)):
            if state.bad_epochs >= config.patience:
                continue  # stopped: its best weights are kept
            results = [row[index] for row in per_step]
            for result in results:
                state.record_step(result)
                listener.on_step(state.step, result)
            state.end_epoch(val_rmse[index], _MemberWeights(stack, index))
            state.history.append(epoch_metrics(results, sizes, seconds, val_rmse[index],
                                               split, plan.device))
            listener.on_epoch(state.epoch, state.step, state.history[-1])
        if progress:
            _print_epoch(epoch + 1, states, config.patience, len(train) / seconds)
    with torch.no_grad():  # the trained weights into each member's network, then its best
        for index, model in enumerate(models):
            model.load_state_dict({**{name: t[index] for name, t in stack.params.items()},
                                   **stack.buffers})
    for model, state in zip(models, states, strict=True):
        state.restore_best(model)
    return states


def _print_epoch(epoch: int, states: list[TrainState], patience: int, rate: float) -> None:
    training = sum(state.bad_epochs < patience for state in states)
    best = [state.best_val_rmse for state in states]
    tqdm.write(f"epoch {epoch:3d}  {len(states)} members stacked ({training} training)  "
               f"best val_rmse {min(best):6.2f} to {max(best):6.2f}  "
               f"{rate * len(states):,.0f} member-samples/s")


def train_members(plans: list, listeners: list[TrainingListener | None] | None = None,
                  progress: bool = False) -> list[TrainingOutcome]:
    """Train the members of `plans` at once (listeners and progress: fit_members) and
    evaluate each as run.train would."""
    models = build_members(plans)
    states = fit_members(models, plans, listeners, progress)
    return [outcome_of(plan, model, state)
            for plan, model, state in zip(plans, models, states, strict=True)]

"""Members of one architecture trained at once: their weights stacked into one network, one
step for them all.

An ensemble's members on one shared split (rul.plan.plan_ensemble) differ only in their seed.
Trained one after the other on a GPU, each small step is bound by kernel launches, not
arithmetic. Stacked (rul.models.stacking.StackedNetwork), one vmapped forward and backward
per micro-batch and one AdamW step carry every member: N members for the launches of one. On
a CPU, where the arithmetic sets the time, stacking is slower than one member after the other
(the DCNN's banded products do not stack; python -m bench members, 5 members: 49.9 s
stacked, 35.0 s one after another in fp32, 24.7 s in bf16).

The stack trains by the run's own epoch loop and step (rul.training.engine.fit_members): the
same loss, accumulation weights, clipping (each member's own norm), optimizer, schedule and
weight average, written once in rul/training. Each member keeps what makes it itself: its
initial weights (built from its own seed), its batch order (its shuffle seed), its gradient
norm and clipping, its weight average and its early stopping (a member that has stopped still
computes, unread, until the last one stops). They share the data, the config and the
learning-rate schedule (one step count), so a step is skipped only when every member's
gradient is not finite: a member alone whose gradient is not finite is recorded as skipped,
its weights turn NaN and it stops early on its best weights.

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

from dataclasses import dataclass

import torch
from torch import nn

from rul.errors import ConfigError
from rul.models.spec import NETWORK_KINDS
from rul.models.stacking import StackedNetwork
from rul.training.engine import fit_members
from rul.training.listener import TrainingListener
from rul.training.run import TrainingOutcome, outcome_of
from rul.training.seeding import seed_everything
from rul.training.settings import TrainingPlan


def stacking_problem(plans: list[TrainingPlan]) -> str | None:
    """Why the members of `plans` cannot train stacked; None when they can."""
    first = plans[0]
    precision = first.precision.name
    asked = precision if first.precision.reason == "asked for" else "auto"
    checks = [
        (len(plans) < 2, "one member"),
        (not NETWORK_KINDS[first.network.kind].stacks,
         f"model={first.network.kind}: vmap does not batch its layers"),
        (any(p.data is not first.data for p in plans), "the members train on different data"),
        (any(_trained(p) != _trained(first) for p in plans[1:]),
         "the members' configs differ in more than their seed"),
        (any(p.resume is not None for p in plans), "a member resumes a checkpoint"),
        (any(p.world.size > 1 for p in plans), "a distributed run"),
        (first.optimization.kind == "muon", "optimizer=muon: its step orthogonalises each "
         "member's matrices, not the stack of them"),
        (precision != "fp32",  # last: the one a user fixes with a key
         f"precision={asked}{f' picks {precision} here' if asked != precision else ''}: "
         "autocast does not reach inside vmap (the members would train in fp32; "
         "precision=fp32 stacks)"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def _trained(plan: TrainingPlan) -> tuple:
    """What a member trains, all but its seeds."""
    return (plan.network, plan.optimization, plan.loop, plan.step, plan.interval_coverage)


# What `python -m bench members` measured on a 2-core CPU with native bf16 (3 epochs of the
# default recipe's DCNN, 5 members), the figure `ensemble_training: auto`'s reason quotes there.
CPU_MEASURED = ("5 members: 49.9 s stacked, 35.0 s one after another in fp32, 24.7 s at "
                "precision auto's bf16")
# And on an NVIDIA H200 (`make gpu-check`'s members rows): stacked members run their steps
# eagerly, where one member alone replays each step from a CUDA graph.
GPU_MEASURED = ("5 members on an H200: 2.2 s stacked, 1.7 s one after another in fp32, 1.3 s "
                "at precision auto's bf16")


@dataclass(frozen=True)
class MemberTraining:
    """How an ensemble's members train, and why (the parent run's ensemble.training tags)."""

    stacked: bool
    reason: str
    note: str | None = None  # one line for the user before training (stacked on a CPU)

    @property
    def name(self) -> str:
        return "stacked" if self.stacked else "sequential"


def member_training(asked: str, plans: list[TrainingPlan], jobs: int = 1) -> MemberTraining:
    """`ensemble_training` (`asked`) for the members `plans`, trained `jobs` at a time:
    sequential or stacked as asked (ConfigError when they cannot stack, or --jobs splits
    them over processes), or `auto`: sequential on every device so far. On a CPU stacking is
    slower than one member after another (CPU_MEASURED), on a GPU too (GPU_MEASURED, by
    `make gpu-check`; docs: Performance)."""
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
    if plans[0].device.type == "cuda":
        return MemberTraining(False, f"auto: on a GPU stacked members are slower than one after "
                                     f"another ({GPU_MEASURED})")
    return MemberTraining(False, f"auto: stacking is not measured on {plans[0].device.type} "
                                 "(ensemble_training=stacked opts in)")


def build_members(plans: list[TrainingPlan]) -> list[nn.Module]:
    """Each member's network, initialized from its own seed as training it alone would; the
    global generators are then seeded by the first member's seeds (dropout's masks)."""
    models = []
    for plan in plans:
        seed_everything(plan.seeds, plan.loop.deterministic)
        models.append(plan.network.build().to(plan.device))
    seed_everything(plans[0].seeds, plans[0].loop.deterministic)
    return models


def train_members(plans: list[TrainingPlan], listeners: list[TrainingListener | None] | None = None,
                  progress: bool = False) -> list[TrainingOutcome]:
    """Train the members of `plans` at once (stacking_problem must be None), each with early
    stopping on its validation RMSE, member i's listeners[i] hearing its steps and epochs as
    it would alone (`progress`: a bar and one line per epoch); each member's network then
    holds its best weights and is evaluated as run.train would."""
    problem = stacking_problem(plans)
    if problem is not None:
        raise ValueError(f"members cannot train stacked: {problem}")
    models = build_members(plans)
    stacked = StackedNetwork(models)
    states = fit_members(stacked, plans, listeners, progress)
    with torch.no_grad():  # the trained weights into each member's network, then its best
        for index, model in enumerate(models):
            model.load_state_dict(stacked.member_state(index))
    for model, state in zip(models, states, strict=True):
        state.restore_best(model)
    return [outcome_of(plan, model, state)
            for plan, model, state in zip(plans, models, states, strict=True)]

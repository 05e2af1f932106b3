"""Members of one architecture trained at once: their weights stacked into one network
(rul.models.stacking.StackedNetwork), one vmapped step for them all, by the run's own epoch
loop and step (rul.training.engine.fit_members).

Each member keeps what makes it itself: its initial weights, batch order and training law,
gradient norm and clipping, weight average and early stopping (a member that has stopped
computes, unread, until the last one stops). They share the data and the schedule, so a step
is skipped only when every member's gradient is not finite; a member alone whose gradient is
not finite turns NaN and stops on its best weights. With dropout 0 each member is the one
trained alone within float rounding (vmap draws dropout's masks from one generator).

`auto` trains members one after another: stacked they were slower on the CPUs and the GPU
measured (python -m bench members; docs: Performance). `stacking_problem` says why members
cannot stack.
"""

from dataclasses import dataclass

import torch
from torch import nn

from rul.errors import ConfigError
from rul.models.spec import NETWORK_KINDS
from rul.models.stacking import StackedNetwork
from rul.training.engine import fit_members
from rul.training.listener import TrainingListener
from rul.training.optimizers import OPTIMIZER_KINDS
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
        (not OPTIMIZER_KINDS[first.optimization.kind].elementwise,
         f"optimizer={first.optimization.kind}: its step is not elementwise (each member's "
         "update would depend on the others' weights)"),
        (precision != "fp32",  # last: the one a user fixes with a key
         f"precision={asked}{f' picks {precision} here' if asked != precision else ''}: "
         "autocast does not reach inside vmap (the members would train in fp32; "
         "precision=fp32 stacks)"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def _trained(plan: TrainingPlan) -> tuple:
    """What a member trains, all but its seeds."""
    return (plan.network, plan.optimization, plan.loop, plan.step, plan.interval_coverage)


# Where the members' figures are (python -m bench members, make gpu-check).
MEASURED = "docs: Performance, ensemble members"


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
    them over processes), or `auto`: sequential on every device measured (MEASURED)."""
    problem = stacking_problem(plans) or (f"--jobs {jobs} trains them in separate processes"
                                          if jobs > 1 else None)
    if asked == "stacked":
        if problem:
            raise ConfigError(f"ensemble_training=stacked: the members cannot train stacked: "
                              f"{problem}")
        slower = (f"ensemble_training=stacked on a CPU: slower than one member after another "
                  f"({MEASURED}); ensemble_training=auto trains them so here"
                  if plans[0].device.type == "cpu" else None)
        return MemberTraining(True, "asked for", slower)
    if asked == "sequential":
        return MemberTraining(False, "asked for")
    if plans[0].device.type == "cpu":
        return MemberTraining(False, f"auto: on a CPU stacked members are slower than one after "
                                     f"another ({MEASURED})")
    if problem:
        return MemberTraining(False, f"auto: cannot stack ({problem})")
    if plans[0].device.type == "cuda":
        return MemberTraining(False, f"auto: on a GPU stacked members are slower than one after "
                                     f"another ({MEASURED})")
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

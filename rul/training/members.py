"""What the epoch loop (engine.py) keeps of each network it trains: one network (a run), or an
ensemble's members stacked into one (rul.models.stacking.StackedNetwork, trained at once:
rul.training.stacked). Each has its own TrainState, listener and batch order (its shuffle
seed); each member's results, validation RMSE, best weights, history and early stopping are
its own, as if trained alone. A member that has stopped still computes, unread, until the
last one stops. For one network every call is the one the loop makes for a run.
"""

import time

import numpy as np
import torch
from tqdm.auto import tqdm

from rul.console import duration
from rul.training.batching import effective_batches, member_batches
from rul.training.listener import TrainingListener
from rul.training.settings import TrainingPlan
from rul.training.state import TrainState
from rul.training.step import StepResult


class _MemberWeights:
    """What TrainState.end_epoch keeps of a stacked member: its state dict."""

    def __init__(self, stacked, index: int):
        self.stacked, self.index = stacked, index

    def state_dict(self) -> dict:
        return self.stacked.member_state(self.index)


class Members:
    def __init__(self, plans: list[TrainingPlan], listeners: list, states: list[TrainState]):
        self.plans = plans
        self.listeners = [listener or TrainingListener() for listener in listeners]
        self.states = states
        self.active: list[int] = []  # the members still training this epoch
        self.results: list[list[StepResult]] = []  # each active member's, this epoch
        self.clock = (time.perf_counter(), states[0].epoch)  # the start: the bar's estimate
        # each training window's probability in an epoch's draw, each member's drawn with its
        # own split seed as it is alone; None: a shuffle
        laws = [plan.train_sampling for plan in plans]
        self.sampling = None if laws[0] is None else [torch.from_numpy(law) for law in laws]

    @property
    def stacked(self) -> bool:
        return len(self.plans) > 1

    @property
    def state(self) -> TrainState:
        """The first member's state (the only one of a run)."""
        return self.states[0]

    @property
    def val_weights(self):
        """Each validation window's weight in the validation RMSE (RunPlan.val_weights): one
        array, or one row per stacked member (each drawn with its own split seed, as trained
        alone); None when every window counts once."""
        weights = [plan.val_weights for plan in self.plans]
        if weights[0] is None:
            return None
        return np.stack(weights) if self.stacked else weights[0]

    def training(self, epochs: int, patience: int) -> bool:
        """Whether any member trains another epoch; starts it for those that do."""
        self.active = [i for i, state in enumerate(self.states)
                       if state.epoch < epochs and state.bad_epochs < patience]
        self.results = [[] for _ in self.states]
        return bool(self.active)

    def batches(self, n: int, batch_size: int, epoch: int, world, device):
        """The epoch's effective batches: a run's indices, or (members, batch) indices."""
        laws = [n] * len(self.plans) if self.sampling is None else self.sampling
        if not self.stacked:
            return effective_batches(laws[0], batch_size, self.plans[0].seeds.shuffle, epoch,
                                     world, device)
        return member_batches(laws, batch_size, [p.seeds.shuffle for p in self.plans], epoch,
                              device)

    def record(self, result: StepResult) -> None:
        """A step's result, each active member's to its state and listener."""
        for index in self.active:
            mine = result.member(index) if self.stacked else result
            state = self.states[index]
            state.record_step(mine)
            self.listeners[index].on_step(state.step, mine)
            self.results[index].append(mine)

    def end_epoch(self, val_rmse, evaluated, metrics_of) -> list[dict]:
        """Each active member's epoch: its validation RMSE (`val_rmse`: one, or one per
        member), best weights (of `evaluated`) and the metrics `metrics_of(results,
        val_rmse=...)` makes of its results, appended to its history; returns them, in order."""
        found = []
        for index in self.active:
            val = val_rmse[index] if self.stacked else val_rmse
            weights = _MemberWeights(evaluated, index) if self.stacked else evaluated
            state = self.states[index]
            state.end_epoch(val, weights)
            state.history.append(metrics_of(self.results[index], val_rmse=val))
            found.append(state.history[-1])
        return found

    def tell(self) -> None:
        """Each active member's listener hears its epoch's end."""
        for index in self.active:
            state = self.states[index]
            self.listeners[index].on_epoch(state.epoch, state.step, state.history[-1])

    def progress_bar(self, batches, total: int, epochs: int, progress: bool):
        state = self.state
        last = f"  last val RMSE {state.history[-1]['val_rmse']:.2f}" if state.history else ""
        trained = f", {len(self.plans)} members stacked" if self.stacked else ""
        left = estimate(self.clock, state.epoch, epochs, time.perf_counter())
        return tqdm(batches, total=total, disable=not progress, leave=False, unit="step",
                    desc=f"epoch {state.epoch + 1}/{epochs}{trained}{last}{left}")

    def print_epoch(self, metrics: list[dict]) -> None:
        if not self.stacked:
            state, found = self.state, metrics[0]
            tqdm.write(f"epoch {state.epoch:3d}  train_loss {found['train_loss_epoch']:.5f}  "
                       f"val_rmse {found['val_rmse']:6.2f}  best {state.best_val_rmse:6.2f}"
                       f"@{state.best_epoch}  {found['samples_per_s']:,.0f} samples/s")
            return
        best = [state.best_val_rmse for state in self.states]
        tqdm.write(f"epoch {max(s.epoch for s in self.states):3d}  {len(self.states)} members "
                   f"stacked ({len(self.active)} training)  best val_rmse {min(best):6.2f} to "
                   f"{max(best):6.2f}  {metrics[0]['samples_per_s'] * len(self.states):,.0f} "
                   "member-samples/s")


def estimate(clock: tuple[float, int], done: int, epochs: int, now: float) -> str:
    """`  about 4.1 min for 12 epochs (1.2 min left)`: the epochs this process trained so far
    (`clock`: when it started and the epochs done then) at their mean time; empty before one
    ended. Early stopping may end the run sooner."""
    started, done_then = clock
    if done <= done_then:
        return ""
    each = (now - started) / (done - done_then)
    return (f"  about {duration(each * epochs)} for {epochs} epochs "
            f"({duration(each * (epochs - done))} left)")

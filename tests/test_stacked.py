"""Members trained at once (rul.training.stacked): each the member trained alone, within float
rounding, when dropout draws nothing; reproducible; and refused, with the reason, where a
member could not keep its own training."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from rul import config as cfg
from rul.plan import plan_ensemble
from rul.training.run import train
from rul.training.seeding import seed_everything
from rul.training.stacked import build_members, fit_members, stacking_problem, train_members

TINY = {"epochs": 2, "patience": 5, "filters": 4, "num_layers": 2, "hidden_size": 16,
        "window": 20, "micro_batch_size": 8, "accumulation_steps": 2, "dropout": 0.0,
        "precision": "fp32", "ensemble": 3, "interval_coverage": None, "register": False}


@pytest.fixture
def members(write_cmapss):
    def plans(**changes):
        config = cfg.load(None, {**TINY, "data_dir": str(write_cmapss()), **changes})
        return plan_ensemble(config).members
    return plans


def _flat(model) -> torch.Tensor:
    return torch.cat([t.flatten() for t in model.state_dict().values()])


def test_each_member_starts_from_the_weights_it_starts_from_alone(members):
    plans = members()
    stacked = build_members(plans)
    for plan, model in zip(plans, stacked, strict=True):
        seed_everything(plan.seeds)
        alone = plan.network.build()
        assert torch.equal(_flat(alone), _flat(model))
    assert not torch.equal(_flat(stacked[0]), _flat(stacked[1]))


def test_without_dropout_each_member_trains_as_it_trains_alone(members):
    plans = members()
    alone = [train(plan, progress=False) for plan in plans]
    stacked = train_members(plans)
    assert len(alone[0].state.grad_norms) >= 8  # steps enough for the rounding to show
    for a, s in zip(alone, stacked, strict=True):
        assert len(s.state.grad_norms) == len(a.state.grad_norms)
        np.testing.assert_allclose(s.state.grad_norms, a.state.grad_norms, rtol=1e-5)
        for key in ("train_loss_epoch", "val_rmse"):
            np.testing.assert_allclose([h[key] for h in s.state.history],
                                       [h[key] for h in a.state.history], rtol=1e-5)
        assert s.state.best_epoch == a.state.best_epoch
        weights = _flat(a.model)
        assert (_flat(s.model) - weights).abs().max() <= 1e-5 * weights.abs().max()
        np.testing.assert_allclose(s.predictions["predicted_rul"],
                                   a.predictions["predicted_rul"], rtol=1e-5, atol=1e-4)
    # the members are still three networks, not one
    assert len({round(s.metrics["test_rmse"], 6) for s in stacked}) == 3


def test_stacked_members_with_dropout_are_reproducible(members):
    plans = members(dropout=0.5, epochs=2)
    first = [s.state for s in train_members(plans)]
    again = [s.state for s in train_members(plans)]
    without = [s.state for s in train_members(members(epochs=2))]  # the same seeds, dropout 0
    for a, b, c in zip(first, again, without, strict=True):
        assert a.grad_norms == b.grad_norms and a.history[-1]["val_rmse"] == \
            b.history[-1]["val_rmse"]
        assert np.isfinite(a.best_val_rmse)
        assert a.grad_norms[0] != c.grad_norms[0]  # the masks drop something from step one
    assert first[0].grad_norms != first[1].grad_norms  # each member its own masks


def test_a_member_stops_early_on_its_own_best_weights(members):
    plans = members(epochs=4, patience=1, lr=0.5)  # a rate that overshoots: bad epochs come
    stacked = train_members(plans)
    alone = [train(plan, progress=False) for plan in plans]
    stopped = [len(s.state.history) for s in stacked]
    assert stopped == [len(a.state.history) for a in alone]
    assert min(stopped) < 4  # at least one member stopped before the last epoch
    for s in stacked:
        assert s.state.best_val_rmse == min(h["val_rmse"] for h in s.state.history)


@pytest.mark.parametrize("changes, reason", [
    ({"model": "lstm"}, "model=lstm: vmap does not batch its layers"),
    ({"precision": "fp16"}, "precision=fp16: autocast does not reach inside vmap (the "
                            "members would train in fp32)"),
    ({"precision": "bf16"}, "precision=bf16: autocast does not reach inside vmap (the "
                            "members would train in fp32)"),
    ({"ensemble_split": "folds"}, "the members train on different data"),
])
def test_what_cannot_stack_is_said_and_refused(members, changes, reason):
    plans = members(**changes)
    assert stacking_problem(plans) == reason
    with pytest.raises(ValueError, match=f"members cannot train stacked: {reason[:20]}"):
        fit_members([plan.network.build() for plan in plans], plans)


def test_members_of_other_configs_or_data_or_alone_do_not_stack(members):
    plans = members()
    assert stacking_problem(plans) is None
    assert stacking_problem(plans[:1]) == "one member"
    other_rate = replace(plans[1], config=plans[1].config.replace(lr=1e-3))  # the same data
    assert stacking_problem([plans[0], other_rate]) == \
        "the members' configs differ in more than their seed"
    other_data = members()[1]  # the same config, data prepared again
    assert stacking_problem([plans[0], other_data]) == "the members train on different data"


def test_autocast_does_not_reach_inside_vmap():
    """Why stacking refuses bf16 and fp16: under torch.func.vmap autocast changes nothing, and
    the members would train in fp32. When a torch makes this fail, stacking_problem can let
    autocast's precisions stack."""
    from torch.func import functional_call, stack_module_state, vmap

    from rul.models.network import build_network

    models = [build_network("cnn", 14, 30, 125.0).eval() for _ in range(2)]
    params, _ = stack_module_state(models)
    buffers = dict(models[0].named_buffers())
    x = torch.randn(2, 8, 30, 14)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        alone = models[0](x[0])
        stacked = vmap(lambda p, x: functional_call(models[0], (p, buffers), (x,)))(params, x)
    assert alone.dtype == torch.bfloat16
    assert stacked.dtype == torch.float32

"""Every row of OPTIMIZER_KINDS through a step, a resume, a split and a stack, each checked
against what the row declares: the config's allowed values, whether the step decides on the
device, what a resume keeps, whether stacked members step as each alone. A new row is checked
by being added."""

import copy

import pytest
import torch
from torch import nn

from rul import config as cfg
from rul.plan import network_of, optimizer_settings
from rul.training.optim import load_optimizer_state, make_optimizer
from rul.training.optimizers import OPTIMIZER_KINDS
from rul.training.precision import resolve_precision
from rul.training.stacked import stacking_problem
from rul.training.step import StepSettings, decides_on_device, optimizer_step

KINDS = list(OPTIMIZER_KINDS)
FP32 = StepSettings(resolve_precision("fp32", torch.device("cpu")), 1.0, 125.0)
TINY = {"filters": 4, "num_layers": 2, "hidden_size": 8, "dropout": 0.0, "kernel_size": 3}


def tiny(kind: str, **changes):
    config = cfg.load(None, {**TINY, "optimizer": kind, **changes})
    torch.manual_seed(0)
    return network_of(config, 5).build(), optimizer_settings(config)


def batch(n: int = 64, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 30, 5, generator=generator),
            torch.rand(n, generator=generator) * 125)


def steps(model, optimizer, n: int, split: int = 1) -> list[float]:
    losses = []
    for i in range(n):
        x, y = batch(seed=i)
        micro = list(zip(x.chunk(split), y.chunk(split), strict=True))
        losses.append(optimizer_step(model, optimizer, FP32.precision.grad_scaler(), micro,
                                     FP32).loss)
    return losses


def test_the_config_allows_exactly_the_rows():
    for kind in KINDS:
        assert cfg.load(None, {"optimizer": kind}).optimizer == kind
    with pytest.raises(cfg.ConfigError, match="optimizer='sgd': must be one of"):
        cfg.load(None, {"optimizer": "sgd"})


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_learns(kind):
    model, settings = tiny(kind)
    losses = steps(model, make_optimizer(model, settings), 6)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("kind", KINDS)
def test_the_device_path_is_what_the_row_declares(kind):
    """Asked to decide on the device, a builder gives an optimizer that can (its rate a
    tensor, the skip taken as GradScaler passes it to a fused optimizer, capturable as
    declared; after a step, a found_inf of 1 moving no weight and no state) exactly when its
    row says so; make_optimizer then builds it so on CUDA, and the step reads that."""
    row = OPTIMIZER_KINDS[kind]
    model, settings = tiny(kind)
    asked = row.build(model, settings, True)
    can = getattr(asked, "_step_supports_amp_scaling", False) and all(
        isinstance(group["lr"], torch.Tensor) for group in asked.param_groups)
    assert can == row.on_device
    assert all(bool(group.get("capturable")) == row.capturable for group in asked.param_groups)
    assert decides_on_device(make_optimizer(model, settings, sync_free=True)) == row.on_device
    assert not decides_on_device(make_optimizer(model, settings))  # a CPU run: the host's
    if not can:
        return
    moved = []
    for found_inf in (0.0, 1.0):
        before = copy.deepcopy((model.state_dict(), asked.state_dict()["state"]))
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        asked.grad_scale, asked.found_inf = None, torch.tensor(found_inf)
        asked.step()
        moved.append(not all(torch.equal(before[0][k], v)
                             for k, v in model.state_dict().items()))
    assert moved == [True, False]
    for index, state in asked.state_dict()["state"].items():
        assert all(torch.equal(before[1][index][k], v) for k, v in state.items())


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_optimizer_continues_bit_for_bit(kind):
    model, settings = tiny(kind)
    optimizer = make_optimizer(model, settings)
    steps(model, optimizer, 3)
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(optimizer.state_dict())
    uninterrupted = steps(model, optimizer, 2)

    again, _ = tiny(kind)
    again.load_state_dict(saved_model)
    resumed = make_optimizer(again, settings)
    load_optimizer_state(resumed, saved, kind)
    assert steps(again, resumed, 2) == uninterrupted
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(),
                                                 model.state_dict().values(), strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_a_resume_keeps_how_the_optimizer_computes(kind):
    """A CPU run's checkpoint resumed where the optimizer decides on the device (CUDA): its
    groups keep what their row says is how it computes (fused), and a rate tensor stays one."""
    model, settings = tiny(kind)
    host = make_optimizer(model, settings)
    steps(model, host, 2)
    there = make_optimizer(model, settings, sync_free=True)
    fresh = [(group.get("fused"), type(group["lr"])) for group in there.param_groups]
    load_optimizer_state(there, host.state_dict(), kind)
    assert [(group.get("fused"), type(group["lr"])) for group in there.param_groups] == fresh
    steps(model, there, 1)  # and it steps


@pytest.mark.parametrize("kind", KINDS)
def test_a_split_of_the_effective_batch_trains_the_same_weights(kind):
    one, settings = tiny(kind)
    four = copy.deepcopy(one)
    steps(one, make_optimizer(one, settings), 3, split=1)
    steps(four, make_optimizer(four, settings), 3, split=4)
    for a, b in zip(one.parameters(), four.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_stacked_members_step_as_each_alone_exactly_when_the_row_says_elementwise(kind):
    """Members stacked as stacking stacks them (each parameter one tensor, members along its
    first dimension): an elementwise optimizer moves each member's slice as it moves that
    member alone; another one does not, and stacking refuses it."""
    members = [tiny(kind)[0] for _ in range(2)]
    for index, member in enumerate(members):
        torch.manual_seed(index)
        for p in member.parameters():
            p.data.normal_()
            p.grad = torch.randn_like(p)
    stacked = nn.Module()
    for name, _ in members[0].named_parameters():
        tensors = [dict(m.named_parameters())[name] for m in members]
        parameter = nn.Parameter(torch.stack([t.detach() for t in tensors]))
        parameter.grad = torch.stack([t.grad for t in tensors])
        stacked.register_parameter(name.replace(".", "_"), parameter)
    settings = tiny(kind)[1]
    make_optimizer(stacked, settings).step()
    for member in members:
        make_optimizer(member, settings).step()
    alike = all(torch.allclose(p[i], dict(m.named_parameters())[name], atol=1e-6)
                for (name, _), p in zip(members[0].named_parameters(), stacked.parameters(),
                                        strict=True)
                for i, m in enumerate(members))
    assert alike == OPTIMIZER_KINDS[kind].elementwise


@pytest.mark.parametrize("kind", KINDS)
def test_stacking_reads_the_row(kind):
    from conftest import fit_plan

    config = cfg.load(None, {**TINY, "optimizer": kind, "precision": "fp32"})
    windows = type("Windows", (), {"values": torch.zeros(1, 5)})()
    plans = [fit_plan(config, windows, windows, precision=FP32.precision)] * 2
    problem = stacking_problem(plans)
    assert (problem is None) == OPTIMIZER_KINDS[kind].elementwise
    if problem:
        assert problem.startswith(f"optimizer={kind}: its step is not elementwise")

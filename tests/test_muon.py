"""`optimizer: muon`: the matrices step as torch.optim.Muon, the rest as torch's AdamW, and a
DCNN's filters and head take Muon, its biases and one-output layers AdamW."""

import copy

import pytest
import torch
from torch import nn

from rul.training.muon import MuonAdamW, takes_muon


def _steps(optimizer, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_a_matrix_steps_as_torch_muon_and_a_bias_as_torch_adamw(weight_decay, monkeypatch):
    """Bit for bit with torch's Muon when the Newton-Schulz iteration runs in bf16 as torch's
    does (rul runs it in float32: the next test)."""
    monkeypatch.setattr(MuonAdamW, "ns_dtype", torch.bfloat16)
    torch.manual_seed(0)
    model = nn.Linear(6, 4)
    reference = copy.deepcopy(model)
    initial = model.weight.detach().clone()
    grads = [(torch.randn(4, 6), torch.randn(4)) for _ in range(5)]
    ours = MuonAdamW(model, lr=0.02, weight_decay=weight_decay)
    muon = torch.optim.Muon([reference.weight], lr=0.02, weight_decay=weight_decay,
                            adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([reference.bias], lr=0.02, weight_decay=weight_decay)

    _steps(ours, [model.weight, model.bias], grads)
    for step_grads in grads:
        reference.weight.grad, reference.bias.grad = (g.clone() for g in step_grads)
        muon.step()
        adamw.step()

    assert torch.equal(model.weight, reference.weight)
    assert torch.equal(model.bias, reference.bias)
    assert not torch.equal(model.weight, initial)


def test_in_float32_a_matrix_steps_as_torch_muon_to_bf16s_rounding():
    torch.manual_seed(0)
    model = nn.Linear(20, 8, bias=False)
    reference = copy.deepcopy(model)
    ours = MuonAdamW(model, lr=0.02)
    muon = torch.optim.Muon(reference.parameters(), lr=0.02, weight_decay=0.0,
                            adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        g = torch.randn(8, 20)
        model.weight.grad, reference.weight.grad = g.clone(), g.clone()
        ours.step()
        muon.step()
    moved = (model.weight - reference.weight).abs().max() / 0.02  # in units of one step
    assert 0 < moved < 0.05


def test_filters_step_as_the_matrix_of_their_rows(monkeypatch):
    """A (out, in, k, 1) convolution's filters move as torch's Muon moves the (out, in * k)
    matrix, in any memory layout."""
    monkeypatch.setattr(MuonAdamW, "ns_dtype", torch.bfloat16)
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 5, (4, 1)).to(memory_format=torch.channels_last)
    flat = nn.Parameter(conv.weight.detach().reshape(5, -1).clone())
    grads = [torch.randn(5, 3, 4, 1).contiguous(memory_format=torch.channels_last)
             for _ in range(4)]
    ours = MuonAdamW(conv, lr=0.01)
    muon = torch.optim.Muon([flat], lr=0.01, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
    for g in grads:
        conv.weight.grad, conv.bias.grad = g, torch.zeros(5)
        ours.step()
        flat.grad = g.reshape(5, -1).clone()
        muon.step()
    assert torch.equal(conv.weight.detach().reshape(5, -1), flat.detach())


def test_the_dcnn_gives_its_filters_and_head_to_muon_and_the_rest_to_adamw():
    from rul.models import build_network

    net = build_network("cnn", 14, 30, 125.0)
    muon = {name for name, p in net.named_parameters() if takes_muon(p)}
    assert muon == {"backbone.features.0.weight", "backbone.features.2.weight",
                    "backbone.features.4.weight", "backbone.features.6.weight",
                    "backbone.head.2.weight"}
    optimizer = MuonAdamW(net, lr=1e-3)
    assert [len(g["params"]) for g in optimizer.param_groups] == [5, len(list(
        net.parameters())) - 5]


def test_a_checkpointed_optimizer_continues_as_it_would_have():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 3), nn.Tanh(), nn.Linear(3, 1))
    x, y = torch.randn(32, 5), torch.randn(32, 1)

    def train(m, opt, n):
        for _ in range(n):
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    straight = copy.deepcopy(model)
    train(straight, MuonAdamW(straight, lr=0.01), 6)
    first = MuonAdamW(model, lr=0.01)
    train(model, first, 3)
    saved = copy.deepcopy((model.state_dict(), first.state_dict()))
    resumed_model = copy.deepcopy(model)
    resumed_model.load_state_dict(saved[0])
    resumed = MuonAdamW(resumed_model, lr=0.01)
    resumed.load_state_dict(saved[1])
    train(resumed_model, resumed, 3)
    for a, b in zip(straight.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)


def _gradient(singular: list[float], rows: int = 50, columns: int = 420, seed: int = 0):
    """A gradient of the DCNN's head's shape with the given singular values (as the head's
    is: one strong direction, the rest three orders of magnitude weaker)."""
    generator = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, rows, generator=generator))
    v, _ = torch.linalg.qr(torch.randn(columns, rows, generator=generator))
    return (u * torch.tensor(singular)) @ v.T


def test_the_floor_damps_directions_below_it_and_keeps_those_above_as_muon():
    from rul.training.muon import orthogonalized

    singular = [1.0, 0.5, 0.2, *[1e-3] * 47]
    plain = torch.linalg.svdvals(orthogonalized(_gradient(singular)))
    floored = torch.linalg.svdvals(orthogonalized(_gradient(singular), floor=0.05))
    assert (plain[:3] > 0.6).all() and (floored[:3] > 0.6).all()  # lifted, as Muon does
    assert (plain[3:] > 0.3).all()  # Muon lifts the weak directions near the strong ones
    assert (floored[3:] < 0.05).all()  # under the floor they are damped, not lifted


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_with_its_floor_a_half_precision_rounding_moves_the_update_little(precision):
    """Two splits of one batch round a half-precision gradient differently (relative noise of
    about a quarter of the dtype's eps, as measured on the DCNN's head): without the floor
    Muon's update differs in its weak directions by far more; with the floor for gradients
    in `precision`, by about a percent."""
    from rul.training.muon import HALF, floor_of, orthogonalized

    gradient = _gradient([1.0, 2e-3, 6e-4, *[3e-5] * 47])
    noise = torch.randn(gradient.shape, generator=torch.Generator().manual_seed(1))
    rounding = noise * (0.25 * torch.finfo(HALF[precision]).eps * gradient.norm()
                        / noise.norm())
    assert floor_of("fp32") == 0.0  # fp32: the iteration as it was, bit for bit

    def moved(floor: float) -> float:
        one, other = (orthogonalized(g, floor=floor) for g in (gradient, gradient + rounding))
        return float((one - other).norm() / one.norm())

    assert moved(floor_of(precision)) < 0.02
    assert moved(0.0) > 5 * moved(floor_of(precision))

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
    from rul.training.muon import floor_of, orthogonalized
    from rul.training.precision import DTYPES

    gradient = _gradient([1.0, 2e-3, 6e-4, *[3e-5] * 47])
    noise = torch.randn(gradient.shape, generator=torch.Generator().manual_seed(1))
    rounding = noise * (0.25 * torch.finfo(DTYPES[precision]).eps * gradient.norm()
                        / noise.norm())
    assert floor_of("fp32") == 0.0  # fp32: the iteration as it was, bit for bit
    assert floor_of("fp16") == floor_of("bf16") > 0  # one update rule in half precision

    def moved(floor: float) -> float:
        one, other = (orthogonalized(g, floor=floor) for g in (gradient, gradient + rounding))
        return float((one - other).norm() / one.norm())

    assert moved(floor_of(precision)) < 0.02
    assert moved(0.0) > 5 * moved(floor_of(precision))



def _small_dcnn() -> nn.Module:
    """Filters and a matrix for Muon; biases and a one-output layer for AdamW."""
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, (5, 1)), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 26, 6), nn.ReLU(), nn.Linear(6, 1))


def _gradients(seed: int, n: int, inf_at: int | None = None) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    steps = [{name: torch.randn(p.shape, generator=generator)
              for name, p in _small_dcnn().named_parameters()} for _ in range(n)]
    if inf_at is not None:
        steps[inf_at]["3.weight"][0, 0] = float("inf")
    return steps


def _both_paths(gradients: list[dict], found_inf: list[float]):
    """The host's MuonAdamW and the one that decides on the device (on the CPU here) stepped
    with the same gradients, weight decay, floor and rates (a warm-up's, set between steps
    as the schedule sets them); a step with found_inf 1 the host does not take."""
    host_model = _small_dcnn()
    device_model = copy.deepcopy(host_model)
    host = MuonAdamW(host_model, lr=0.02, weight_decay=0.1, floor=0.01)
    device = MuonAdamW(device_model, lr=0.02, weight_decay=0.1, floor=0.01, on_device=True)
    for step, (grads, skip) in enumerate(zip(gradients, found_inf, strict=True)):
        rate = 0.02 * (1 + step) / len(gradients)
        for group in host.param_groups:
            group["lr"] = rate
        for group in device.param_groups:
            group["lr"].fill_(rate)
        for model in (host_model, device_model):
            for name, p in model.named_parameters():
                p.grad = grads[name].clone()
        if not skip:
            host.step()
        device.found_inf = torch.tensor(skip)
        device.step()
        del device.found_inf
    return host_model, device_model, host, device


def test_the_step_decided_on_the_device_is_the_hosts_bit_for_bit():
    """Muon's matrices and the AdamW of the rest: five steps, the third's gradient inf and
    not taken; every weight and every state tensor equal to the host's, bit for bit (the
    skipped step counted nothing)."""
    host_model, device_model, host, device = _both_paths(_gradients(0, 5, inf_at=2),
                                                         [0.0, 0.0, 1.0, 0.0, 0.0])
    assert device.on_device and all(group["capturable"] for group in device.param_groups)
    assert isinstance(device.param_groups[0]["lr"], torch.Tensor)
    for (name, a), b in zip(host_model.named_parameters(), device_model.parameters(),
                            strict=True):
        assert torch.equal(a, b), name
        state, theirs = host.state[a], device.state[b]
        assert list(state) == list(theirs) and int(theirs["step"]) == 4
        for key in state:
            assert torch.equal(state[key], theirs[key]), (name, key)


def test_a_step_not_taken_on_the_device_moves_nothing():
    """found_inf 1 on NaN gradients: no weight, momentum, moment or step count moves."""
    _, model, _, optimizer = _both_paths(_gradients(1, 2), [0.0, 0.0])
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(optimizer.state_dict()["state"])
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    optimizer.found_inf = torch.tensor(1.0)
    optimizer.step()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    for index, tensors in optimizer.state_dict()["state"].items():
        assert all(torch.equal(state[index][k], v) for k, v in tensors.items())


@pytest.mark.parametrize("on_device", [False, True])
def test_a_step_given_a_closure_is_the_step_after_its_backward(on_device):
    """As torch's optimizers (Lightning hands every step one): the closure runs with
    gradients on, its loss comes back, and the weights move as after backward() and step()."""
    x = torch.randn(8, 1, 30, 1, generator=torch.Generator().manual_seed(2))
    models = [_small_dcnn(), _small_dcnn()]
    by_hand, given = (MuonAdamW(m, lr=1e-2, weight_decay=0.1, on_device=on_device)
                      for m in models)
    models[0](x).square().mean().backward()
    assert by_hand.step() is None

    def closure():
        given.zero_grad()
        loss = models[1](x).square().mean()
        loss.backward()
        return loss

    loss = given.step(closure)
    assert loss is not None and loss.grad_fn is not None
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)

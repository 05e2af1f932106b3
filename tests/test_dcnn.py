"""The DCNN's convolution path (models/cnn.py; CUDA and autocast take it, and `banded = False`):
the fused trim + tanh, slicing then nn.Tanh without the copies autograd makes around a slice,
and on CPU tanh as 2 sigmoid(2x) - 1 (within 2e-7 of torch.tanh). The banded-product path is
in test_banded.py."""

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from bench.speed import as_before
from rul.models.cnn import DCNN, TrimmedTanh


def convolutions(model: DCNN) -> DCNN:
    model.banded = False
    return model


def sliced_then_tanh(model: DCNN) -> DCNN:
    """The same network as it was built before the fusion (bench speed's reference)."""
    as_before(convolutions(model).features).to(memory_format=torch.channels_last)
    return model


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    torch.manual_seed(1)  # the same dropout mask
    out = model(x)
    nn.functional.mse_loss(out, y).backward()
    return out.detach(), {name: p.grad for name, p in model.named_parameters()}


def exact(model: DCNN) -> DCNN:
    for layer in model.features:
        if isinstance(layer, TrimmedTanh):
            layer.exact = True
    return model


@pytest.mark.parametrize("kernel", [2, 3, 10])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_fused_trim_tanh_matches_slice_then_tanh(kernel, layout):
    """With torch.tanh (`exact`) bit for bit; with tanh as 2 sigmoid(2x) - 1 (the CPU default)
    within float32 rounding (a wrong trim or gradient is off by orders of magnitude more)."""
    torch.manual_seed(kernel)
    fused = convolutions(DCNN((14, 30), kernel_size=kernel))
    reference = sliced_then_tanh(DCNN((14, 30), kernel_size=kernel))
    reference.load_state_dict(fused.state_dict())  # the same keys: old models still load
    bitwise = exact(convolutions(DCNN((14, 30), kernel_size=kernel)))
    bitwise.load_state_dict(fused.state_dict())
    if layout == "nchw":
        for model in (fused, reference, bitwise):
            model.features.to(memory_format=torch.contiguous_format)
    x, y = torch.rand(8, 30, 14), torch.rand(8)
    expected, expected_grads = forward_backward(reference, x, y)
    out, grads = forward_backward(bitwise, x, y)
    assert out.shape == (8,) and torch.equal(out, expected)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
    out, grads = forward_backward(fused, x, y)
    torch.testing.assert_close(out, expected, rtol=0, atol=2e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=2e-6, msg=name)
    for model in (fused, reference, bitwise):
        model.eval()
    with torch.no_grad():
        assert torch.equal(bitwise(x), reference(x))
        torch.testing.assert_close(fused(x), reference(x), rtol=0, atol=2e-6)


@pytest.mark.parametrize("trim", [0, 1])
def test_tanh_values_and_gradient(trim):
    x = (torch.linspace(-12, 12, 2 * 3 * 41 * 4).reshape(2, 3, 41, 4)).requires_grad_()
    out = TrimmedTanh(kernel_size=10 if trim else 3)(x)
    assert out.shape == (2, 3, 41 - trim, 4)
    torch.testing.assert_close(out, torch.tanh(x[:, :, trim:]), rtol=0, atol=2.5e-7)
    assert out.abs().max() <= 1  # saturates at exactly +-1
    out.sum().backward()
    if trim:
        assert torch.equal(x.grad[:, :, 0], torch.zeros(2, 3, 4))
    # tanh's gradient from its own output, 1 - tanh^2 (tanh_backward)
    torch.testing.assert_close(x.grad[:, :, trim:], 1 - out.detach() ** 2, rtol=0, atol=1e-7)


def test_fp16_keeps_torch_tanh():
    """2 sigmoid(2x) - 1 in half precision would turn tanh(0.001) into 0: fp16 keeps torch.tanh
    (bf16 computes the formula in float32, below)."""
    x = torch.full((2, 3, 11, 4), 1e-3, dtype=torch.float16)
    out = TrimmedTanh(kernel_size=10)(x)
    assert out.dtype == torch.float16 and torch.equal(out, torch.tanh(x[:, :, 1:]))


def test_bf16_tanh_is_float32_tanh_rounded_once():
    """bf16 (CPU autocast): the float32 formula, rounded to bf16 once: small values keep their
    digits (bf16 sigmoid would make them 0 or +-2^-7), +-1 saturates exactly, values from
    1e-4 up are tanh's float32 value rounded (but for a few in a million, one bf16 step off),
    and every value is within the float32 formula's own 1.2e-7 of it (as for float32)."""
    x = torch.linspace(-12, 12, 2 * 3 * 41 * 4)
    x[:200] = torch.logspace(-8, 0, 200) * torch.tensor([1.0, -1.0]).repeat(100)
    x = x.reshape(2, 3, 41, 4).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    out = TrimmedTanh(kernel_size=10)(x)
    expected = torch.tanh(x[:, :, 1:].float()).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    error = (out.float() - expected.float()).abs()
    step = expected.float().abs() * 2 ** -7  # one bf16 step (8 significant bits)
    assert (error <= torch.clamp(step, min=1.2e-7)).all()
    tiny = x[:, :, 1:].float().abs() < 1e-4
    assert (error[~tiny] <= step[~tiny]).all() and (out != expected)[~tiny].sum() <= 1
    small = ~tiny & (x[:, :, 1:].float().abs() < 1e-2)
    assert small.sum() > 40 and torch.equal(out[small], expected[small])
    assert out.float().abs().max() == 1


@pytest.mark.parametrize("banded, autocast", [(True, False), (False, False), (False, True)])
def test_cpu_tanh_is_computed_through_sigmoid(banded, autocast):
    """The point of tanh_into's formula on CPU, on both paths and under bf16 autocast: no
    aten::tanh on the 10-channel activations (2-3x slower than sigmoid there)."""
    x = torch.rand(64, 30, 14)
    model = DCNN((14, 30))
    model.banded = banded
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(x)
    activations = ([64 * 14, 30 * 10],) if banded else ()
    names = [e.name for e in prof.events() if e.input_shapes and (
        e.input_shapes[0][:2] == [64, 10] or e.input_shapes[0] in activations)]
    assert "aten::sigmoid" in names and "aten::tanh" not in names


def full_size_copies(model: nn.Module) -> list[str]:
    """Copy and fill ops on whole activation tensors in one training step."""
    x, y = torch.rand(64, 30, 14), torch.rand(64)
    forward_backward(model, x, y)  # warm-up
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        forward_backward(model, x, y)
    return [f"{e.name}{e.input_shapes}" for e in prof.events()
            if e.name in ("aten::copy_", "aten::fill_", "aten::zero_")
            and e.input_shapes and e.input_shapes[0][:2] == [64, 10]
            and e.input_shapes[0][2] >= 30]


def test_a_training_step_copies_no_activation_tensor():
    """What the fusion is for: slicing then tanh costs, per layer, a zero-filled gradient of the
    untrimmed shape, a copy into its slice and a layout copy before the next convolution."""
    torch.manual_seed(0)
    assert full_size_copies(convolutions(DCNN((14, 30)))) == []
    assert len(full_size_copies(sliced_then_tanh(DCNN((14, 30))))) >= 8  # the check can fail


@pytest.mark.parametrize("kernel", [2, 3, 10])
def test_unfolded_convolutions_compute_the_convolutions(kernel):
    """DCNN.unfolded (each layer one matrix product; off by default, timed on a GPU by
    `make gpu-check`): the convolutions' output and every gradient within float32 rounding,
    from the same parameters (a wrong padding, trim or weight order is off by far more)."""
    torch.manual_seed(kernel)
    reference = exact(convolutions(DCNN((14, 30), kernel_size=kernel)))
    unfolded = exact(convolutions(DCNN((14, 30), kernel_size=kernel)))
    unfolded.load_state_dict(reference.state_dict())
    unfolded.unfolded = True
    x, y = torch.rand(8, 30, 14), torch.rand(8)
    expected, expected_grads = forward_backward(reference, x, y)
    out, grads = forward_backward(unfolded, x, y)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6,
                                   msg=name)

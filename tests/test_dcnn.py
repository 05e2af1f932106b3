"""The DCNN's fused trim + tanh (models/cnn.py): the same numbers as slicing then nn.Tanh, bit
for bit, without the copies autograd makes around a slice."""

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from bench.speed import as_before
from rul.models.cnn import DCNN, TrimmedTanh


def sliced_then_tanh(model: DCNN) -> DCNN:
    """The same network as it was built before the fusion (bench speed's reference)."""
    as_before(model.features).to(memory_format=torch.channels_last)
    return model


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    torch.manual_seed(1)  # the same dropout mask
    out = model(x)
    nn.functional.mse_loss(out, y).backward()
    return out.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("kernel", [2, 3, 10])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_fused_trim_tanh_is_bitwise_equal_to_slice_then_tanh(kernel, layout):
    torch.manual_seed(kernel)
    fused = DCNN(14, 30, kernel_size=kernel)
    reference = sliced_then_tanh(DCNN(14, 30, kernel_size=kernel))
    reference.load_state_dict(fused.state_dict())  # the same keys: old models still load
    if layout == "nchw":
        fused.features.to(memory_format=torch.contiguous_format)
        reference.features.to(memory_format=torch.contiguous_format)
    x, y = torch.rand(8, 30, 14), torch.rand(8)
    out, grads = forward_backward(fused, x, y)
    expected, expected_grads = forward_backward(reference, x, y)
    assert out.shape == (8,)
    assert torch.equal(out, expected)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, expected_grads[name]), name
    fused.eval(), reference.eval()
    with torch.no_grad():
        assert torch.equal(fused(x), reference(x))


def test_the_leading_step_of_an_even_kernel_gets_a_zero_gradient():
    x = torch.randn(2, 3, 11, 4, requires_grad=True)
    out = TrimmedTanh(kernel_size=10)(x)
    assert out.shape == (2, 3, 10, 4)
    torch.testing.assert_close(out, torch.tanh(x[:, :, 1:]), rtol=0, atol=0)
    out.sum().backward()
    assert torch.equal(x.grad[:, :, 0], torch.zeros(2, 3, 4))
    torch.testing.assert_close(x.grad[:, :, 1:], 1 - torch.tanh(x[:, :, 1:].detach()) ** 2)


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
    assert full_size_copies(DCNN(14, 30)) == []
    assert len(full_size_copies(sliced_then_tanh(DCNN(14, 30)))) >= 8  # the check can fail

"""The DCNN's banded-product path (models/banded.py), its CPU fast path: the same network as
the convolutions, up to float32 rounding, with the same parameters."""

import copy
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import rul.models.cnn as cnn
import rul.plan
from rul import config as cfg
from rul.models.banded import band_plan, banded_tanh, offset
from rul.models.cnn import DCNN, TimeConv

ROOT = Path(__file__).resolve().parents[1]

# (kernel, window, filters, layers): the default; odd kernels; a window shorter than the
# kernel; a 1-tap kernel; more filters than a block's width needs
SHAPES = [(10, 30, 10, 4), (3, 30, 10, 4), (2, 7, 4, 2), (11, 40, 16, 3), (10, 5, 10, 4),
          (1, 30, 3, 1), (4, 30, 64, 2)]


def both_paths(kernel, window, filters, layers):
    torch.manual_seed(kernel * 100 + window)
    banded = DCNN((14, window), filters=filters, kernel_size=kernel, num_layers=layers)
    with torch.no_grad():  # biases too (DCNN starts them at 0; training does not keep them)
        for parameter in banded.features.parameters():
            parameter.normal_(0, 0.3)
    convolutions = copy.deepcopy(banded)
    convolutions.banded = False
    return banded, convolutions


def train_step(model, x, y):
    torch.manual_seed(1)  # the same dropout mask
    out = model(x)
    nn.functional.mse_loss(out, y).backward()
    return out.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("shape", SHAPES)
def test_banded_products_compute_the_convolutions(shape):
    """Outputs and every parameter's gradient within float32 rounding of the convolutions' (a
    wrong tap, offset, block edge or gradient is off by orders of magnitude more)."""
    banded, convolutions = both_paths(*shape)
    window = shape[1]
    x, y = torch.rand(16, window, 14), torch.rand(16)
    expected, expected_grads = train_step(convolutions, x, y)
    out, grads = train_step(banded, x, y)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        scale = expected_grads[name].abs().max().item()
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-5 * scale,
                                   msg=name)
    banded.eval(), convolutions.eval()
    with torch.no_grad():
        torch.testing.assert_close(banded(x), convolutions(x), rtol=1e-5, atol=1e-5)


def test_the_state_dict_is_the_convolutions():
    """Models saved before the banded path load into it, and the other way round."""
    banded, convolutions = both_paths(10, 30, 10, 4)
    assert banded.state_dict().keys() == convolutions.state_dict().keys()
    assert all(isinstance(m, nn.Conv2d) for m in banded.features if hasattr(m, "weight"))


def test_the_banded_path_is_bitwise_reproducible():
    first, _ = both_paths(10, 30, 10, 4)
    second = copy.deepcopy(first)
    x, y = torch.rand(32, 30, 14), torch.rand(32)
    out1, grads1 = train_step(first, x, y)
    out2, grads2 = train_step(second, x, y)
    assert torch.equal(out1, out2)
    assert all(torch.equal(grads1[k], grads2[k]) for k in grads1)


def count_banded_calls(monkeypatch) -> list:
    calls = []
    real = cnn.banded_tanh

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(cnn, "banded_tanh", spy)
    return calls


def test_cpu_float32_takes_the_banded_path_and_autocast_the_convolutions(monkeypatch):
    calls = count_banded_calls(monkeypatch)
    model, x = DCNN((14, 30)), torch.rand(4, 30, 14)
    model(x)
    assert calls == [(56, 30), (56, 300), (56, 300), (56, 300), (56, 300)]  # 5 layers
    calls.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16
    assert calls == []
    model.banded = False
    model(x)
    assert calls == []


def dense_matrix(conv: TimeConv, length: int) -> torch.Tensor:
    """The convolution's matrix, from its response to each unit input: row (s, ci), column
    (t, co), time-major and channels last (what the banded path computes with)."""
    c_in, c_out = conv.in_channels, conv.out_channels
    layer = nn.Sequential(conv, cnn.TrimmedTanh(conv.kernel_size[0], exact=True))
    with torch.no_grad():
        conv.bias.zero_()
        units = torch.eye(length * c_in).view(-1, length, c_in).permute(0, 2, 1)[..., None]
        z = torch.atanh(layer(units.contiguous()).clamp(-0.999999, 0.999999))
    return z[..., 0].permute(0, 2, 1).reshape(length * c_in, length * c_out)


@pytest.mark.parametrize("kernel,c_in,c_out", [(10, 10, 10), (10, 1, 10), (3, 10, 1),
                                               (2, 4, 4)])
def test_the_blocks_hold_the_whole_band(kernel, c_in, c_out):
    """The blocks of M and of its transpose are M's own entries, and M has no nonzero entry
    outside them: each output (input) column block with the input (output) rows it uses."""
    length = 30
    conv = TimeConv(c_in, c_out, kernel, trim=False)
    with torch.no_grad():
        conv.weight.normal_(0, 0.05)
    dense = dense_matrix(conv, length)
    plan = band_plan(length, c_in, c_out, kernel)
    padded = torch.cat([conv.weight.detach().reshape(-1), torch.zeros(1)])
    for blocks, index, transposed in ((plan.forward, plan.forward_index, False),
                                      (plan.backward, plan.backward_index, True)):
        start, covered = 0, torch.zeros_like(dense, dtype=torch.bool)
        for a, b, (rows, cols) in blocks:
            block = padded[index[start:start + rows * cols]].view(rows, cols)
            start += rows * cols
            expected = dense[b, a].t() if transposed else dense[a, b]
            torch.testing.assert_close(block, expected, rtol=1e-4, atol=1e-5)
            if transposed:
                covered[b, a] = True
            else:
                covered[a, b] = True
        assert start == len(index)
        outside = dense[~covered]
        assert outside.numel() == 0 or outside.abs().max() < 1e-6


@pytest.mark.parametrize("kernel,length,c_in,c_out", [(10, 12, 1, 3), (10, 12, 2, 3),
                                                      (3, 9, 3, 1), (2, 7, 2, 2), (7, 4, 2, 2),
                                                      (10, 30, 2, 10)])
def test_gradients_are_the_functions_own(kernel, length, c_in, c_out):
    """torch.autograd.gradcheck in float64 (finite differences against the hand-written
    backward), also for a kernel longer than the window and over 6 blocks."""
    assert len(band_plan(length, c_in, c_out, kernel).forward) == (6 if length == 30 else 1)
    torch.manual_seed(0)
    x = torch.randn(3, length * c_in, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(c_out, c_in, kernel, 1, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(c_out, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: banded_tanh(*a, kernel), (x, weight * 0.3, bias))


def test_gradients_are_laid_out_as_their_parameters():
    """channels_last weights get channels_last gradients (DDP's gradient buckets warn and
    autograd copies on every backward otherwise); a frozen layer gets none."""
    model = DCNN((14, 30))
    model.features[0].bias.requires_grad_(False)
    model(torch.rand(8, 30, 14)).sum().backward()
    for name, parameter in model.features.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad.stride() == parameter.stride(), name
    assert model.features[0].bias.grad is None
    middle = model.features[2].weight  # (10, 10, 10, 1): channels_last is not contiguous
    assert middle.stride() != middle.contiguous().stride()


def test_a_row_that_is_not_whole_steps_is_refused():
    with pytest.raises(ValueError, match=r"expects \(sequences, length x 10\)"):
        banded_tanh(torch.rand(4, 25), torch.rand(10, 10, 3, 1), torch.rand(10), 3)


def test_the_default_layer_does_1_25_times_the_convolutions_work():
    """Blocks trade zeros multiplied for products BLAS runs fast (docs: Performance)."""
    plan = band_plan(30, 10, 10, 10)
    multiply_adds = sum(rows * cols for *_, (rows, cols) in plan.forward)
    assert multiply_adds / (30 * 10 * 10 * 10) == 1.25
    assert offset(10) == -4 and offset(3) == -1  # TimeConv's "same": pad k // 2, trim even k


PAGE_FAULTS = """
import resource, sys, torch
from rul.training.hardware import keep_freed_memory
from bench.memory import RECIPE
if sys.argv[1] == "keep":
    assert keep_freed_memory()
model = RECIPE.network.build()
x, y = torch.rand(256, RECIPE.network.window, RECIPE.network.n_features), torch.rand(256)
def step():
    nn = torch.nn.functional.mse_loss(model(x), y)
    nn.backward()
per_step = []
for _ in range(4):  # the first window grows the heap once (its pages fault in once)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    per_step.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
print(min(per_step[1:]))
"""


def test_a_cpu_training_keeps_freed_memory(monkeypatch):
    class Called(Exception):
        pass

    def keep_freed_memory():
        raise Called  # stops the run before any data is read

    def prepare_data(*args, **kwargs):
        raise AssertionError("reached the data without keeping freed memory")

    monkeypatch.setattr(rul.plan, "keep_freed_memory", keep_freed_memory)
    monkeypatch.setattr(rul.plan, "prepare_data", prepare_data)
    with pytest.raises(Called):
        rul.plan.plan_run(cfg.load(ROOT / "experiments" / "fd001.yaml", ["device=cpu"]))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
@pytest.mark.slow
def test_keeping_freed_memory_ends_the_page_faults_of_each_step():
    """What hardware.keep_freed_memory is for: without it the default step faults its
    activation buffers in again (hundreds to thousands of page faults per step); with it the
    steps stop faulting once the heap has grown. glibc adapts its own thresholds now and then
    (a CI run once saw a default process without faults), so the default gets three tries; and
    the kernel may fault a kept process's settled pages too (a CI run once saw 23 per step, as
    NUMA balancing or page reclaim do), so the kept process gets three tries as well. A kept
    process that keeps nothing faults thousands of times per step in every try."""
    def faults(mode: str) -> float:  # per step, the fewest of windows 2-4
        done = subprocess.run([sys.executable, "-c", PAGE_FAULTS, mode], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return float(done.stdout.split()[-1])

    kept = []
    while len(kept) < 3 and not any(fewest < 20 for fewest in kept):
        kept.append(faults("keep"))
    assert kept[-1] < 20, kept
    default = []
    while len(default) < 3 and not any(fewest > 20 for fewest in default):
        default.append(faults("default"))
    assert default[-1] > 20, default

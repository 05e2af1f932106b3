"""The DCNN's dropout (rul/models/dropout.py): a Bernoulli mask drawn cheaply on CPU, the same
masks however a batch is split, and nn.Dropout's behaviour everywhere else."""

import pytest
import torch
from torch import nn

from rul.models import build_network
from rul.models.dropout import CheapMaskDropout, keep_mask


@pytest.mark.parametrize("p", [0.5, 0.3, 0.1])
def test_mask_keeps_each_element_with_probability_1_minus_p_scaled_by_its_inverse(p):
    torch.manual_seed(0)
    mask = keep_mask(torch.Size((2000, 450)), p, torch.float32)
    assert mask.shape == (2000, 450)
    assert mask.unique().tolist() == [0.0, pytest.approx(1 / (1 - p))]
    kept = (mask > 0).double().mean().item()
    sigma = ((1 - p) * p / mask.numel()) ** 0.5
    assert abs(kept - (1 - p)) < 5 * sigma, (kept, 1 - p)


def test_fair_coins_are_independent_across_bit_positions_and_words():
    """p = 0.5 takes 16 mask elements from each random word: every bit position is a fair coin,
    and neighbours (in one word, across words, across rows) are uncorrelated."""
    torch.manual_seed(0)
    keep = (keep_mask(torch.Size((4096, 64)), 0.5, torch.float32) > 0).double()
    by_bit = keep.view(4096, 4, 16).mean(dim=(0, 1))  # each of the 16 bit positions
    assert (by_bit - 0.5).abs().max() < 5 * (0.25 / (4096 * 4)) ** 0.5, by_bit
    centred = keep - keep.mean()

    def correlation(a, b):
        return ((a * b).mean() / (a.std() * b.std())).item()

    bound = 5 / keep.numel() ** 0.5
    assert abs(correlation(centred[:, :-1], centred[:, 1:])) < bound  # neighbouring bits
    assert abs(correlation(centred[:, :-16], centred[:, 16:])) < bound  # neighbouring words
    assert abs(correlation(centred[:-1], centred[1:])) < bound  # neighbouring rows


@pytest.mark.parametrize("p", [0.5, 0.3])
@pytest.mark.parametrize("shape", [(12, 450), (12, 465), (12, 3, 7), (12, 1)])
def test_a_batch_split_in_parts_draws_the_same_mask(p, shape):
    """As with bernoulli_: 5 + 7 rows drawn one after the other = 12 rows drawn at once, also
    for rows whose length is no multiple of 16 (the effective batch decides the training,
    whatever its micro-batches)."""
    torch.manual_seed(3)
    whole = keep_mask(torch.Size(shape), p, torch.float32)
    torch.manual_seed(3)
    parts = [keep_mask(torch.Size((n, *shape[1:])), p, torch.float32) for n in (5, 7)]
    assert torch.equal(torch.cat(parts), whole)


def test_masks_come_from_torchs_generator():
    torch.manual_seed(7)
    a = keep_mask(torch.Size((64, 450)), 0.5, torch.float32)
    torch.manual_seed(7)
    b = keep_mask(torch.Size((64, 450)), 0.5, torch.float32)
    c = keep_mask(torch.Size((64, 450)), 0.5, torch.float32)
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_training_multiplies_by_the_mask_and_so_does_the_gradient():
    dropout = CheapMaskDropout(0.5).train()
    x = torch.randn(32, 450, requires_grad=True)
    torch.manual_seed(1)
    out = dropout(x)
    torch.manual_seed(1)
    mask = keep_mask(x.shape, 0.5, x.dtype)
    assert torch.equal(out, x * mask)
    out.sum().backward()
    assert torch.equal(x.grad, mask)


def test_the_mean_output_is_the_input():
    torch.manual_seed(0)
    dropout = CheapMaskDropout(0.3).train()
    x = torch.randn(4, 450)
    mean = torch.stack([dropout(x) for _ in range(4000)]).mean(dim=0)
    # each element: mean of 4000 draws of x / 0.7 w.p. 0.7, std |x| sqrt(0.3 / 0.7 / 4000)
    assert ((mean - x).abs() <= 5 * x.abs() * (0.3 / 0.7 / 4000) ** 0.5 + 1e-6).all()


def test_bfloat16_in_bfloat16_out_and_inplace():
    x = torch.randn(8, 450).to(torch.bfloat16)
    torch.manual_seed(2)
    out = CheapMaskDropout(0.5).train()(x)
    assert out.dtype == torch.bfloat16 and set(torch.unique(out / x).tolist()) <= {0.0, 2.0}
    y = x.clone()
    torch.manual_seed(2)
    assert CheapMaskDropout(0.5, inplace=True).train()(y) is y
    assert torch.equal(y, out)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_eval_mode_and_p_0_pass_the_input_through_without_drawing(p):
    x = torch.randn(8, 450)
    dropout = CheapMaskDropout(p).train(p == 0.0)
    state = torch.get_rng_state()
    assert torch.equal(dropout(x), x)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_dcnn_head_uses_it_with_the_configured_p():
    net = build_network("cnn", 15, 30, 125.0, dropout=0.3)
    dropouts = [m for m in net.modules() if isinstance(m, nn.Dropout)]
    assert len(dropouts) == 1 and isinstance(dropouts[0], CheapMaskDropout)
    assert dropouts[0].p == 0.3


def test_bench_speeds_reference_draws_its_masks_as_before():
    """bench speed's reference is the DCNN as it was before the speed work: nn.Dropout's
    bernoulli_ masks; its "bernoulli" row is today's path with them, its default ours."""
    from bench.speed import default_model

    def dropout_of(kind):
        (layer,) = [m for m in default_model(kind).modules() if isinstance(m, nn.Dropout)]
        return type(layer)

    assert dropout_of("before") is nn.Dropout and dropout_of("bernoulli") is nn.Dropout
    assert dropout_of("default") is CheapMaskDropout and dropout_of("conv") is CheapMaskDropout


@pytest.mark.parametrize("shape", [(0, 450), (0,), ()])
def test_empty_and_0_dim_inputs(shape):
    x = torch.ones(shape)
    out = CheapMaskDropout(0.5).train()(x)
    assert out.shape == x.shape and set(out.flatten().tolist()) <= {0.0, 2.0}


def test_off_the_cpu_it_is_nn_dropout_and_leaves_the_cpu_generator_alone():
    x = torch.ones(8, 450, device="meta")
    state = torch.get_rng_state()
    out = CheapMaskDropout(0.5).train()(x)
    assert out.device.type == "meta" and out.shape == x.shape
    assert torch.equal(torch.get_rng_state(), state)

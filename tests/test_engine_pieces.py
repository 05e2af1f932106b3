"""Metrics, derived seeds, model constraints (config tests: tests/test_config.py)."""

import math

import numpy as np
import pytest
from torch import nn

from rul import config as cfg
from rul.evaluation.metrics import mae, phm08_score, rmse, rul_metrics
from rul.plan import network_of
from rul.training.seeding import derive_seeds


def test_phm08_score_against_hand_computed_values():
    # d = -13 -> e^1 - 1; d = 0 -> 0; d = 10 -> e^1 - 1; d = -26 -> e^2 - 1; d = 20 -> e^2 - 1
    assert phm08_score([87, 100, 110], [100, 100, 100]) == pytest.approx(2 * (math.e - 1))
    assert phm08_score([74], [100]) == pytest.approx(math.e**2 - 1)
    assert phm08_score([120], [100]) == pytest.approx(math.e**2 - 1)
    # late is penalized more than early by the same amount
    assert phm08_score([110], [100]) > phm08_score([90], [100])


def test_rmse_over_all_units_not_mean_of_batches():
    pred, true = np.array([0.0, 0.0, 10.0, 10.0]), np.zeros(4)
    assert rmse(pred, true) == pytest.approx(math.sqrt(50))  # sqrt(200/4)
    batch_mean = (rmse(pred[:3], true[:3]) + rmse(pred[3:], true[3:])) / 2
    assert batch_mean == pytest.approx((math.sqrt(100 / 3) + 10) / 2)  # what we must not do
    assert mae(pred, true) == pytest.approx(5.0)


def test_rul_metrics_cap_the_true_rul():
    m = rul_metrics([125.0, 50.0], [200, 50], rul_cap=125)
    assert m["rmse"] == 0.0
    assert m["rmse_uncapped"] == pytest.approx(math.sqrt(75**2 / 2))


def test_eval_predictions_are_clamped_to_the_target_range_training_outputs_are_not():
    import torch

    net = network_of(cfg.load(None, {"hidden_size": 16, "dropout": 0.0}), 14).build()
    last = net.backbone.head[-1]
    x = torch.randn(4, 30, 14)
    for bias, expected in ((5.0, 125.0), (-5.0, 0.0)):  # backbone output x rul_cap: +-625
        nn.init.constant_(last.bias, bias)
        raw = net.train()(x)
        assert (raw > 125).all() if bias > 0 else (raw < 0).all()
        raw.sum().backward()  # training keeps the gradient outside the range
        assert last.bias.grad.abs().item() == pytest.approx(4 * 125)
        last.bias.grad = None
        assert torch.equal(net.eval()(x), torch.full((4,), expected))
    with torch.no_grad():
        nn.init.zeros_(last.weight)
        nn.init.constant_(last.bias, 0.5)
        assert torch.equal(net.eval()(x), torch.full((4,), 62.5))  # in range: unchanged


def test_derived_seeds_are_distinct_and_stable():
    a, b = derive_seeds(42), derive_seeds(42)
    assert a == b
    assert len(set(a.as_dict().values()) - {42}) == 5
    assert derive_seeds(43).split != a.split


def test_run_identity_ignores_tracking_keys():
    """A run's identity (what --resume looks for) ignores where and how it is tracked."""
    from rul.tracking.run_names import config_digest

    base = cfg.load("experiments/fd001.yaml")
    tracked = base.replace(tracking_uri="sqlite:///elsewhere.db", run_name="mine",
                           register=False, checkpoint_dir="elsewhere")
    assert config_digest(base) == config_digest(tracked)
    assert config_digest(base) != config_digest(base.replace(lr=0.003))


def test_the_cap_rule_lives_in_one_place():
    from rul.preprocessing.target import cap_rul

    capped = cap_rul(np.array([10.0, 125.0, 300.0], dtype=np.float32), 125)
    assert capped.dtype == np.float32 and capped.tolist() == [10.0, 125.0, 125.0]
    assert cap_rul(np.array([200, 5]), 130.5).tolist() == [130.5, 5]
    assert cap_rul(np.array([200.0]), None).tolist() == [200.0]

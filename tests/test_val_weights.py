"""val_weights: the validation RMSE of an epoch weighs each window as asked, for a run and for
each stacked member with its own weights."""

import numpy as np
import pytest
import torch
from torch import nn

from rul.evaluation.metrics import rmse
from rul.evaluation.truncation import truncation_weights, window_weights
from rul.preprocessing.windows import WindowSet
from rul.training.batching import WindowBatches
from rul.training.predict import validation_rmse

UNITS = np.repeat([1, 2, 3], [5, 20, 40])  # validation windows per engine: 5, 20 and 40


class Fixed(nn.Module):
    """Predicts rows of `table` (windows along the last axis), whatever the input."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.table = torch.as_tensor(table, dtype=torch.float32)
        self.seen = 0

    def forward(self, x):
        out = self.table[..., self.seen:self.seen + len(x)]
        self.seen = (self.seen + len(x)) % self.table.shape[-1]
        return out


@pytest.fixture
def batches():
    n = len(UNITS)
    windows = WindowSet(values=np.zeros((n + 2, 2), np.float32), starts=np.arange(n),
                        targets=np.linspace(0, 125, n).astype(np.float32), window=3,
                        units=UNITS)
    return WindowBatches(windows, torch.device("cpu"))


def test_windows_weighs_every_window_once_and_truncation_each_engine_once():
    assert window_weights("windows", UNITS, 3, seed=0) is None
    weights = window_weights("truncation", UNITS, 3, seed=0)
    np.testing.assert_array_equal(weights, truncation_weights(UNITS, 3, 0))
    per_engine = [weights[np.equal(UNITS, u)].sum() for u in (1, 2, 3)]
    assert per_engine == pytest.approx([per_engine[0]] * 3)  # 5 windows count as 40 do


def test_the_weighted_validation_rmse_is_the_weighted_mean_of_squared_errors(batches):
    targets = batches.targets.numpy().astype(np.float64)
    predicted = targets + np.where(UNITS == 1, 20.0, 1.0)  # the short engine is far off
    weights = truncation_weights(UNITS, 3, 0)
    plain = validation_rmse(Fixed(predicted), batches)
    weighted = validation_rmse(Fixed(predicted), batches, weights=weights)
    assert plain == pytest.approx(rmse(predicted, targets))
    assert weighted == pytest.approx(np.sqrt(np.average((predicted - targets) ** 2,
                                                        weights=weights)))
    assert weighted > 2 * plain  # engine 1 counts as much as engine 3 now


def test_stacked_members_each_take_their_own_row_of_weights(batches):
    targets = batches.targets.numpy().astype(np.float64)
    # the second member's errors vary within an engine: its weights' draw shows
    predicted = np.stack([targets + np.where(UNITS == 1, 20.0, 1.0), targets * 1.2])
    weights = np.stack([truncation_weights(UNITS, 3, seed) for seed in (0, 1)])
    found = validation_rmse(Fixed(predicted), batches, weights=weights)
    alone = [validation_rmse(Fixed(row), batches, weights=w)
             for row, w in zip(predicted, weights, strict=True)]
    assert found == pytest.approx(alone, rel=1e-12)
    assert validation_rmse(Fixed(predicted), batches) == pytest.approx(
        [validation_rmse(Fixed(row), batches) for row in predicted], rel=1e-12)

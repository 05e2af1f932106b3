"""train_sampling: an epoch shuffles every training window once (windows, the default) or
draws as many windows with replacement as the test units are cut off (truncation), each
training engine equally often, anywhere in 0.2-0.97 of its life."""

import numpy as np
import pytest
import torch
from conftest import synthetic_frame

from rul import config as cfg
from rul.evaluation.truncation import (
    LIFE_FRACTION,
    TRAINING_DRAWS,
    truncation_points,
    window_weights,
)
from rul.plan import plan_run
from rul.training.batching import effective_batches, member_batches
from rul.training.distributed import World
from rul.training.run import train

WINDOW = 30
UNITS = np.repeat([1, 2, 3], [20, 80, 170])  # full windows per engine: lives 49, 109 and 199


def test_windows_is_a_shuffle_and_truncation_weighs_each_engine_once_over_its_test_life():
    assert window_weights("windows", UNITS, WINDOW, 0, TRAINING_DRAWS) is None
    weights = window_weights("truncation", UNITS, WINDOW, 0, TRAINING_DRAWS)
    per_engine = [weights[np.equal(UNITS, u)].sum() for u in (1, 2, 3)]
    assert per_engine == pytest.approx([1 / 3] * 3)  # 20 windows weigh as much as 170
    t, life = truncation_points(UNITS, WINDOW)
    fraction = t / life
    last = LIFE_FRACTION[1] + 0.5 / life  # t is the fraction x life rounded
    assert weights[fraction > last].sum() == 0  # no window past the test's last cut
    first = np.r_[True, UNITS[1:] != UNITS[:-1]]  # cuts before a full window take the first
    assert weights[(fraction < LIFE_FRACTION[0] - 0.5 / life) & ~first].sum() == 0
    inside = (UNITS == 3) & (fraction > 0.25) & (fraction < 0.9)  # uniform in the fraction:
    expected = per_engine[2] / (np.diff(LIFE_FRACTION)[0] * 199)  # each cycle alike
    assert weights[inside].mean() == pytest.approx(expected, rel=0.02)
    assert weights[inside].min() > expected / 2


def test_an_epoch_draws_as_many_windows_from_the_law_the_same_on_resume_and_for_each_rank():
    weights = torch.tensor([0.5, 0.25, 0.25, 0.0], dtype=torch.float64)
    drawn = torch.cat([torch.cat(list(effective_batches(weights, 3, 7, epoch)))
                       for epoch in range(4000)])
    assert len(drawn) == 4 * 4000  # n windows an epoch: as many steps as a shuffle
    frequencies = torch.bincount(drawn, minlength=4).double() / len(drawn)
    torch.testing.assert_close(frequencies, weights, atol=0.01, rtol=0)
    batches = list(effective_batches(torch.ones(1100), 512, 7, 3))
    assert [len(b) for b in batches] == [512, 512, 76]
    again = list(effective_batches(torch.ones(1100), 512, 7, 3))
    assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))  # a resume
    assert any(len(b.unique()) < len(b) for b in batches)  # with replacement
    shares = [list(effective_batches(torch.ones(1100), 512, 7, 3, World(r, 2, r)))
              for r in (0, 1)]
    for batch, *parts in zip(batches, *shares, strict=True):
        assert torch.equal(torch.cat(parts).sort().values, batch.sort().values)
    other = torch.arange(1100.0)  # another member's law (drawn with its own split seed)
    stacked = next(member_batches([torch.ones(1100), other], 512, [7, 8], 3))
    assert torch.equal(stacked[0], batches[0])  # each member draws as it would alone
    assert torch.equal(stacked[1], next(effective_batches(other, 512, 8, 3)))


SMALL = {"filters": 4, "hidden_size": 8, "num_layers": 1, "window": 20, "epochs": 2,
         "patience": 5, "precision": "fp32", "device": "cpu", "register": False,
         "micro_batch_size": 16, "accumulation_steps": 2}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A subset whose training engines differ in length fourfold."""
    from conftest import TEST_LENGTHS, frame_to_text

    folder = tmp_path_factory.mktemp("engines")
    lengths = (40, 160) * 5
    (folder / "train_FD001.txt").write_text(frame_to_text(synthetic_frame(lengths)))
    (folder / "test_FD001.txt").write_text(frame_to_text(synthetic_frame(TEST_LENGTHS, seed=1)))
    (folder / "RUL_FD001.txt").write_text("".join(f"{v} \n" for v in (10, 17, 24, 31)))
    return folder


def test_a_run_trains_on_the_law_it_is_given(engines, tmp_path, monkeypatch):
    """The run's epochs draw from its plan's law (drawn with the split seed): short engines as
    often as long ones; the default shuffle is every window once."""
    import rul.training.members as members

    drawn = []

    def recorded(*args, **kwargs):
        for batch in effective_batches(*args, **kwargs):
            drawn.append(batch)
            yield batch

    monkeypatch.setattr(members, "effective_batches", recorded)
    found = {}
    for how in ("windows", "truncation"):
        plan = plan_run(cfg.load(None, {**SMALL, "data_dir": str(engines), "train_sampling": how,
                                        "checkpoint_dir": str(tmp_path / how)}))
        drawn.clear()
        outcome = train(plan, progress=False)
        train_units = plan.data.train.units
        ids, windows = np.unique(train_units, return_counts=True)
        short = set(ids[windows < 50].tolist())
        draws = torch.cat(drawn)
        found[how] = (np.isin(train_units[draws.numpy()], list(short)).mean(),
                      outcome.state.history[-1]["train_loss_epoch"])
        assert len(draws) == SMALL["epochs"] * len(train_units)  # as many steps either way
        if how == "windows":  # each window once an epoch
            assert torch.bincount(draws).tolist() == [SMALL["epochs"]] * len(train_units)
    engines_short = len(short) / len(ids)  # about half of the training engines
    assert found["windows"][0] < engines_short / 3  # 21 windows each, against 141
    assert found["truncation"][0] == pytest.approx(engines_short, abs=0.1)
    assert found["truncation"][1] != found["windows"][1]

"""The effective batch's split is a memory choice in every precision, for the recipe `make train`
trains (Muon; `python -m bench split` checks every optimizer): 512 x 1, 256 x 2 and 128 x 4
skip the same steps and their per-step losses agree within each precision's bound
(bench.gpu_check.LOSS_BOUND, the one `make gpu-check` holds a GPU to, with the same check:
gpu_check.check_splits). On a CPU with a share of FD001's engines and no warm-up, so that a
short epoch steps at the full rate; `python -m bench split` measures the whole first epoch
(docs: Performance)."""

import dataclasses

import pytest

from bench.gpu_check import Check, check_splits
from rul.data import load_subset

ENGINES = 20  # FD001's first training engines: an epoch of a few steps (fp16 is emulated)


@pytest.mark.slow  # fp16 on a CPU is emulated: ~1 min
def test_the_recipes_splits_train_alike_in_every_precision(real_data_dir):
    subset = load_subset("FD001", real_data_dir)
    subset = dataclasses.replace(subset, train=subset.train[subset.train["unit"] <= ENGINES])
    check = Check()
    check_splits(check, subset, dry=False, changes={"device": "cpu", "warmup_epochs": 0})
    assert len(check.rows) == 6 and check.failed == []

"""One training run on 2 processes (gloo on CPU) equals the same effective batch on one.

The engine-level test starts 2 processes with torch.multiprocessing (gloo on 127.0.0.1, a
free port); the end-to-end tests start `torchrun --nproc-per-node 2 --standalone -m rul train`
in a temporary MLflow store and are marked slow.
"""

import os
import socket
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rul import config as cfg
from rul.models import build_model
from rul.training.batching import WindowBatches
from rul.training.distributed import World, global_batch_size, rank_share, share_weights
from rul.training.engine import fit
from rul.training.listener import TrainingListener
from rul.training.precision import resolve_precision
from rul.training.seeding import derive_seeds

CPU = torch.device("cpu")
FP32 = resolve_precision("fp32", CPU)
# 2 full effective batches of 512, then a short one of 301 (151 + 150 windows on 2 ranks:
# micro-batches 128 + 23 and 128 + 22), and 512 + 1 (rank 1's share of the last is empty).
UNEVEN, ONE_LEFT = 2 * 512 + 301, 512 + 1


def tiny_config(micro: int, k: int):
    return cfg.load(None, {"model": "cnn", "filters": 4, "kernel_size": 3, "hidden_size": 16,
                           "num_layers": 1, "dropout": 0.0, "precision": "fp32", "epochs": 1,
                           "micro_batch_size": micro, "accumulation_steps": k, "seed": 3})


def trimmed(window_set, n):
    return replace(window_set, starts=window_set.starts[:n], targets=window_set.targets[:n])


class StepLosses(TrainingListener):
    def __init__(self):
        self.losses = []

    def on_step(self, step, result):
        self.losses.append(result.loss)


def train_once(config, train_set, val_set, n_features, world=None):
    """(per-step losses, final weights) of 1 epoch; the same weight init on every rank."""
    torch.manual_seed(0)
    model = build_model(config, n_features)
    losses = StepLosses()
    fit(model, config, FP32, derive_seeds(config.seed), WindowBatches(train_set, CPU),
        WindowBatches(val_set, CPU), listener=losses, progress=False, world=world)
    return losses.losses, {k: v.clone() for k, v in model.state_dict().items()}


def _rank_main(rank, world_size, port, sets, n_features, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results = {n: train_once(tiny_config(128, 2), train_set, val_set, n_features,
                                 World(rank, world_size, rank))
                   for n, (train_set, val_set) in sets.items()}
    finally:
        dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fd001_sets(real_data_dir):
    from rul.workflow import prepare_data

    config = replace_dir(tiny_config(256, 2), real_data_dir)
    prepared = prepare_data(config, derive_seeds(config.seed))
    val = trimmed(prepared.val, 300)
    return ({n: (trimmed(prepared.train, n), val) for n in (UNEVEN, ONE_LEFT)},
            prepared.preprocessor.n_features)


def replace_dir(config, data_dir):
    return cfg.load(None, {**config.to_dict(), "data_dir": str(data_dir)})


def relative_error(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


def test_two_ranks_equal_one_process_with_the_same_effective_batch(fd001_sets, tmp_path):
    sets, n_features = fd001_sets
    mp.start_processes(_rank_main, args=(2, free_port(), sets, n_features, str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for n, (train_set, val_set) in sets.items():
        steps = -(-n // 512)
        assert n % 512 and steps >= 2  # the epoch's last step is short
        for micro, k in ((256, 2), (512, 1)):
            losses, weights = train_once(tiny_config(micro, k), train_set, val_set, n_features)
            assert len(losses) == steps
            for losses_2, weights_2 in ranks[0][n], ranks[1][n]:
                assert relative_error(losses_2, losses) < 1e-5, (n, micro, k)
                for key, value in weights.items():
                    assert relative_error(weights_2[key], value) < 1e-5, (n, micro, k, key)
            untrained = untrained_weights(n_features)  # equal, and not merely untouched
            assert max(relative_error(weights[k], v) for k, v in untrained.items()) > 1e-3


def untrained_weights(n_features):
    torch.manual_seed(0)
    return build_model(tiny_config(128, 2), n_features).state_dict()


def test_rank_share_weights_are_the_global_share_times_world_size(fd001_sets):
    sets, _ = fd001_sets
    train = WindowBatches(sets[UNEVEN][0], CPU)
    assert global_batch_size(UNEVEN, 512, 2) == 301
    assert share_weights([128, 23], 301, 2) == pytest.approx([256 / 301, 46 / 301])
    # the ranks' weights, averaged as DDP does, sum to 1 over the global batch
    total = sum(sum(share_weights(s, 301, 2)) for s in ([128, 23], [128, 22])) / 2
    assert total == pytest.approx(1.0)
    empty = next(iter(torch.arange(1)[1::2].split(128)))  # rank 1's share of 1 sample
    batches, weights = rank_share(train, [empty], 1, 2)  # a zero-weight stand-in
    assert weights == [0.0] and len(batches) == 1 and len(batches[0][1]) == 1
    batches, weights = rank_share(train, [torch.arange(3)], 3, 1)
    assert weights is None and len(batches[0][1]) == 3

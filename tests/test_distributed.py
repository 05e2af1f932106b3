"""One training run on 2 processes (gloo on CPU) equals the same effective batch on one.

The engine-level test starts 2 processes with torch.multiprocessing (gloo on 127.0.0.1, a
free port); the end-to-end tests start `torchrun --nproc-per-node 2 --standalone -m rul train`
in a temporary MLflow store and are marked slow.
"""

import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import fit_plan
from mlflow.tracking import MlflowClient

from rul import config as cfg
from rul.plan import network_of
from rul.tracking.metric_names import logged
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
    return replace(window_set, starts=window_set.starts[:n], targets=window_set.targets[:n],
                   units=window_set.units[:n])


class StepLosses(TrainingListener):
    def __init__(self):
        self.losses = []

    def on_step(self, step, result):
        self.losses.append(result.loss)


def train_once(config, train_set, val_set, n_features, world=None):
    """(per-step losses, final weights) of 1 epoch; the same weight init on every rank."""
    torch.manual_seed(0)
    model = network_of(config, n_features).build()
    losses = StepLosses()
    fit(model, fit_plan(config, train_set, val_set, precision=FP32, world=world), losses,
        progress=False)
    return losses.losses, {k: v.clone() for k, v in model.state_dict().items()}


def _rank_main(rank, world_size, port, sets, n_features, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results = {n: train_once(tiny_config(128, 2), train_set, val_set, n_features,
                                 World(rank, world_size, rank))
                   for n, (train_set, val_set) in sets.items()}
        dist.barrier()  # as rul's process_group: no teardown while the peer still talks
    finally:
        dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fd001_sets(real_data_dir):
    from rul.plan import prepared

    config = replace_dir(tiny_config(256, 2), real_data_dir)
    prepared = prepared(config, derive_seeds(config.seed).split)
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
    return network_of(tiny_config(128, 2), n_features).build().state_dict()


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


# `torchrun ... worker.py train ...` = `torchrun ... -m rul train ...`, plus two test hooks:
# on a non-zero rank every file opened for writing is reported on stderr ("WROTE <path>"),
# and RUL_TEST_DIE_AT_STEP=s makes rank 1 exit abruptly after its optimizer step s.
WORKER = textwrap.dedent('''
    import os
    import sys

    rank = int(os.environ["RANK"])
    if rank != 0:
        import tempfile

        tempfile.gettempdir()  # the stdlib's probe (writes and removes a file): done, not seen
        WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND

        def report_writes(event, args):
            if event == "open" and len(args) == 3:
                path, mode, flags = args
                writes = any(c in mode for c in "wax+") if isinstance(mode, str) \\
                    else bool((flags or 0) & WRITE)
                if writes and path not in ("/dev/null",):
                    os.write(2, f"WROTE {path}\\n".encode())

        sys.addaudithook(report_writes)
    die_at = int(os.environ.get("RUL_TEST_DIE_AT_STEP", 0))
    if die_at and rank == 1:
        from rul.training import run
        from rul.training.listener import Listeners, TrainingListener

        class Die(TrainingListener):
            def on_step(self, step, result):
                if step == die_at:  # once rank 0 waits in its next collective: it fails there
                    import time  # before torchrun's SIGTERM comes (not while rank 0 computes)

                    time.sleep(1)
                    os._exit(1)

        train = run.train
        run.train = lambda plan, listener=None, *a, **k: train(
            plan, Listeners(listener, Die()), *a, **k)
    from rul.cli import main

    main(sys.argv[1:], prog_name="rul")
''')
TINY = ["model=cnn", "filters=4", "kernel_size=3", "hidden_size=16", "num_layers=1",
        "dropout=0.0", "precision=fp32", "epochs=2", "seed=3"]


def run_rul(args, store, launcher, env_extra=None, timeout=240):
    env = {**os.environ, "PYTHONPATH": REPO,
           "PYTHONDONTWRITEBYTECODE": "1", "MLFLOW_TRACKING_URI": store.uri,
           **(env_extra or {})}
    return subprocess.run([*launcher, "train", *TINY, *args, "--no-progress"], cwd=store.root,
                          env=env, capture_output=True, text=True, timeout=timeout)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchrun(tmp_path, monitor_interval=None):
    """torchrun with 2 ranks running WORKER; `monitor_interval`: how often (s) torchrun checks
    its workers (its default 0.1)."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    every = ["--monitor-interval", str(monitor_interval)] if monitor_interval else []
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *every,
            "--standalone", str(worker)]


def runs_of(store):
    client = MlflowClient(store.uri)
    return client, client.search_runs([e.experiment_id for e in client.search_experiments()])


def step_losses(client, run_id) -> dict[int, float]:
    """The run's train loss per step (a resumed run re-logs a few steps: the last one wins)."""
    history = sorted(client.get_metric_history(run_id, "train/loss"), key=lambda m: m.timestamp)
    return {m.step: m.value for m in history}


@pytest.fixture(scope="module")
def one_process_run(real_data_dir, mlflow_store_at, tmp_path_factory):
    """The reference: (256, K=2) on one process, tracked; its step losses and metrics."""
    with mlflow_store_at(tmp_path_factory.mktemp("one_process")) as store:
        one = run_rul([f"data_dir={real_data_dir}", "micro_batch_size=256",
                       "accumulation_steps=2"], store, [sys.executable, "-m", "rul"])
        assert one.returncode == 0, one.stderr[-3000:]
        client, (run,) = runs_of(store)
        return step_losses(client, run.info.run_id), run.data.metrics


def assert_same_training(client, run, reference):
    losses, metrics = reference
    got = step_losses(client, run.info.run_id)
    # 2 epochs of 28 steps: the split_seed's training engines' windows / 512, the last one short
    assert sorted(got) == sorted(losses) and len(got) == 2 * 28
    assert relative_error([got[s] for s in sorted(got)], [losses[s] for s in sorted(got)]) < 1e-5
    for metric in ("test_rmse", "best_val_rmse"):
        assert run.data.metrics[logged(metric)] == pytest.approx(metrics[logged(metric)],
                                                                 rel=1e-4)


@pytest.mark.slow
def test_torchrun_trains_one_tracked_run_equal_to_one_process(mlflow_store, real_data_dir,
                                                              tmp_path, one_process_run):
    two = run_rul([f"data_dir={real_data_dir}", "micro_batch_size=128", "accumulation_steps=2"],
                  mlflow_store, torchrun(tmp_path))
    assert two.returncode == 0, two.stderr[-3000:]
    assert "WROTE" not in two.stderr  # rank 1 wrote no file
    client, runs = runs_of(mlflow_store)
    assert len(runs) == 1  # rank 1 created no MLflow run
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2"
    assert run.data.params["effective_batch_size"] == "512"
    assert run.data.tags["seed.rank_0"] != run.data.tags["seed.rank_1"]
    assert_same_training(client, run, one_process_run)


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_run_failed_and_resume_continues_it(
        mlflow_store, real_data_dir, tmp_path, one_process_run):
    args = [f"data_dir={real_data_dir}", "micro_batch_size=128", "accumulation_steps=2"]
    # torchrun SIGTERMs the survivor once it sees rank 1 gone; rank 1 dies while rank 0 waits
    # in a collective, and torchrun checks every 5 s, not 0.1 s: rank 0's collective fails
    # first also on a loaded machine (docs: Scale out says what a user sees otherwise)
    died = run_rul(args, mlflow_store, torchrun(tmp_path, monitor_interval=5),
                   {"RUL_TEST_DIE_AT_STEP": "30"})
    assert died.returncode != 0
    assert "another rank of the run stopped" in died.stderr
    assert "rul/cli.py" not in died.stderr  # a clear error, no traceback of rank 0's own
    client, runs = runs_of(mlflow_store)
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "another rank" in runs[0].data.tags["error"]

    resumed = run_rul([*args, "--resume"], mlflow_store, torchrun(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after epoch 1" in resumed.stderr
    (run,) = runs_of(mlflow_store)[1]
    assert run.info.status == "FINISHED"
    assert_same_training(client, run, one_process_run)

"""The CUDA path, where a GPU is: run with `pytest -m gpu` (skipped elsewhere; `make gpu-check`
prints the same promises as one table, at full size).

Split equivalence per precision, resume bit for bit with the GradScaler's state, the CUDA
graph against the same steps run eagerly, the memory probe, and a model trained on the GPU
served on a CPU."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rul import config as cfg
from rul.plan import ResumeTarget, plan_run, prepared
from rul.training import cuda_graph
from rul.training.checkpoint import Checkpointer
from rul.training.listener import TrainingListener
from rul.training.run import train
from rul.training.seeding import derive_seeds

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DEFAULT = os.path.join(os.path.dirname(__file__), "..", "experiments", "fd001.yaml")
TINY = {"filters": 4, "num_layers": 2, "hidden_size": 16, "device": "cuda", "patience": 10}


@pytest.fixture(autouse=True)
def _deterministic_cublas(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def config(real_data_dir, tmp_path, **changes):
    return cfg.load(DEFAULT, {**TINY, "data_dir": str(real_data_dir),
                              "checkpoint_dir": str(tmp_path / "ckpt"), **changes})


class Steps(TrainingListener):
    def __init__(self, stop_after: int | None = None):
        self.results, self.stop_after = [], stop_after

    def on_step(self, step, result):
        self.results.append(result)

    def on_epoch(self, epoch, step, metrics):
        if epoch == self.stop_after:
            raise KeyboardInterrupt


def run(cfg_, subset, resume=None, **kwargs):
    data = prepared(cfg_, derive_seeds(cfg_.seed).split, subset)
    return train(plan_run(cfg_, resume, data=data), progress=False, **kwargs)


def same_weights(a, b) -> bool:
    a, b = a.model.state_dict(), b.model.state_dict()
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("precision, bound", [("fp32", 1e-3), ("fp16", 1e-2), ("bf16", 5e-2)])
def test_the_split_changes_neither_the_skipped_steps_nor_the_scale(real_data_dir, fd001,
                                                                   tmp_path, precision, bound):
    runs = {}
    for micro, k in ((512, 1), (256, 2), (128, 4)):
        steps = Steps()
        run(config(real_data_dir, tmp_path, precision=precision, micro_batch_size=micro,
                   accumulation_steps=k, dropout=0.0, seed=7, epochs=1,
                   interval_coverage=None), fd001, listener=steps)
        runs[(micro, k)] = steps.results
    reference = runs[(512, 1)]
    for split, steps in runs.items():
        assert [s.skipped for s in steps] == [s.skipped for s in reference], split
        assert [s.scale for s in steps] == [s.scale for s in reference], split
        for step, ref in zip(steps, reference, strict=True):
            assert step.loss == pytest.approx(ref.loss, rel=bound), split


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_resumed_cuda_run_is_the_uninterrupted_run_bit_for_bit(real_data_dir, fd001,
                                                                 tmp_path, precision):
    cfg_ = config(real_data_dir, tmp_path, precision=precision, epochs=4, deterministic=True)
    reference = run(cfg_, fd001)
    checkpointer = Checkpointer(tmp_path / "ckpt" / "run.pt")
    with pytest.raises(KeyboardInterrupt):
        run(cfg_, fd001, listener=Steps(stop_after=2), checkpointer=checkpointer)
    saved = checkpointer.load()
    resumed_steps = Steps()
    resumed = run(cfg_, fd001, ResumeTarget(checkpointer.path), listener=resumed_steps)
    assert same_weights(resumed, reference)
    assert resumed.metrics == reference.metrics
    assert [h["val_rmse"] for h in resumed.state.history] == [
        h["val_rmse"] for h in reference.state.history]
    if precision == "fp16":  # the GradScaler goes on from its saved scale and growth count
        assert resumed_steps.results[0].scale == saved["scaler"]["scale"]
        assert saved["scaler"]["_growth_tracker"] >= 0


def test_the_cuda_graph_computes_what_the_eager_steps_compute(real_data_dir, fd001, tmp_path,
                                                              monkeypatch):
    cfg_ = config(real_data_dir, tmp_path, precision="fp16", epochs=3, deterministic=True)
    graphed = run(cfg_, fd001)
    monkeypatch.setattr(cuda_graph, "ENABLED", False)
    eager = run(cfg_, fd001)
    assert same_weights(graphed, eager) and graphed.metrics == eager.metrics


def test_the_memory_probe_measures_the_cuda_step(real_data_dir, fd001, tmp_path):
    cfg_ = config(real_data_dir, tmp_path, micro_batch_size="auto", precision="fp16",
                  memory_budget="1GiB")
    data = prepared(cfg_, derive_seeds(cfg_.seed).split, fd001)
    plan = plan_run(cfg_, data=data)
    assert plan.split is not None and plan.split.peak_bytes <= 2**30
    measured = [row for row in plan.split.table if row.peak_bytes > 0]
    assert measured and all(b.peak_bytes >= a.peak_bytes for a, b in zip(measured, measured[1:]))
    assert plan.config.micro_batch_size * plan.config.accumulation_steps >= 512


def test_a_model_trained_on_the_gpu_serves_on_a_cpu(mlflow_store, real_data_dir, tmp_path):
    from rul.workflows.train import train_tracked

    cfg_ = config(real_data_dir, tmp_path, precision="auto", epochs=2,
                  tracking_uri=mlflow_store.uri)
    outcome, run_id = train_tracked(cfg_, progress=False)
    assert outcome.plan.precision.device.type == "cuda"
    script = textwrap.dedent(f"""
        import mlflow, pandas as pd, torch
        from rul.data.reader import read_input
        mlflow.set_tracking_uri({mlflow_store.uri!r})
        model = mlflow.pyfunc.load_model("models:/rul-fd001@champion")
        out = model.predict(read_input({str(real_data_dir / "test_FD001.txt")!r}))
        assert not torch.cuda.is_available()
        print(len(out), out["rul"].between(0, 125).all())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["100", "True"]


def test_stacked_members_on_the_gpu_train_as_each_alone_and_are_tracked(mlflow_store,
                                                                         real_data_dir,
                                                                         tmp_path):
    """ensemble_training: stacked on CUDA (fp32, dropout 0): each member's first steps are
    those of the member trained alone within fp32's rounding (TF32 off: on, it rounds the
    products of the two runs apart by ~2e-3 in 10 steps), and every run FINISHED."""
    from mlflow.tracking import MlflowClient

    from bench.members import full_fp32
    from rul.plan import plan_ensemble
    from rul.workflows.ensemble import train_ensemble

    cfg_ = config(real_data_dir, tmp_path, precision="fp32", epochs=2, dropout=0.0, ensemble=3,
                  ensemble_training="stacked", interval_coverage=None, register=False,
                  tracking_uri=mlflow_store.uri)
    with full_fp32():
        outcome, run_id = train_ensemble(cfg_, progress=False)
        alone = [train(plan, progress=False) for plan in plan_ensemble(cfg_).members]
    for member, single in zip(outcome.members, alone, strict=True):
        stacked_norms = member.state.grad_norms[:10]
        assert stacked_norms == pytest.approx(single.state.grad_norms[:10], rel=1e-3)
        assert next(member.model.parameters()).device.type == "cuda"
    client = MlflowClient(mlflow_store.uri)
    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{run_id}'")
    assert parent.data.tags["ensemble.training"] == "stacked"
    assert [r.info.status for r in [parent, *children]] == ["FINISHED"] * 4

"""The effective batch decides the model; micro x K is measured memory: `auto`, the probe, the
out-of-memory back-off, and the memory bench without mlflow or optuna."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import fit_plan
from torch import nn

import rul.plan
from rul import config as cfg
from rul.plan import plan_run
from rul.training.backoff import BackoffStep
from rul.training.engine import fit
from rul.training.hardware import cpu_has_native_bf16
from rul.training.listener import TrainingListener
from rul.training.micro_batch import ProbeRow, candidates, choose_split, probe
from rul.training.precision import resolve_precision
from rul.training.run import train
from rul.training.seeding import derive_seeds, seed_everything
from rul.training.step import StepSettings

ROOT = Path(__file__).resolve().parents[1]
CPU_FP32 = resolve_precision("fp32", torch.device("cpu"))
SMALL = {"filters": 8, "hidden_size": 32, "num_layers": 2, "dropout": 0.0, "ema_decay": 0.0,
         "deterministic": True, "patience": 100}


def auto_split(config, data):
    """(config as trained, the probe's SplitChoice) of `config` planned on `data` (fp32, CPU)."""
    plan = plan_run(config.replace(precision="fp32", device="cpu"), data=data)
    return plan.config, plan.split


def prepared(config, subset=None):
    return rul.plan.prepared(config, derive_seeds(config.seed).split, subset)


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("budget, problem", [
    ("-1GiB", "must be a memory size such as 6GiB"),
    ("lots", "must be a memory size such as 6GiB"),
    (0, "must be a memory size greater than 0"),
    ("0MiB", "must be a memory size greater than 0"),
])
def test_bad_memory_budgets_are_one_line_config_errors(budget, problem):
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(None, {"micro_batch_size": "auto", "effective_batch_size": 512,
                        "memory_budget": budget})
    assert str(error.value) == f"overrides: memory_budget={budget!r}: {problem}" + (
        " (such as 512MiB)" if "greater" in problem else ", 512MiB or 2GB (or null)")


def test_memory_budget_is_parsed_once_into_bytes():
    config = cfg.load(None, {"micro_batch_size": "auto", "effective_batch_size": 512,
                             "memory_budget": "6GiB"})
    assert config.memory_budget == 6 * 2**30
    assert cfg.load(None, {"memory_budget": "1.5GB"}).memory_budget == 1_500_000_000
    assert config.replace(lr=1e-2).memory_budget == 6 * 2**30  # survives a round trip


def test_the_effective_batch_is_stated_or_derived_and_a_disagreement_is_an_error():
    assert cfg.load().effective_batch_size == 512  # 256 x 2, as before
    assert cfg.load(None, {"micro_batch_size": 64}).effective_batch_size == 128
    short_last = cfg.load(None, {"micro_batch_size": 192, "accumulation_steps": 3,
                                 "effective_batch_size": 512})
    assert short_last.effective_batch_size == 512
    with pytest.raises(cfg.ConfigError, match=r"effective_batch_size=1000: disagrees with "
                       r"micro_batch_size=256 x accumulation_steps=2"):
        cfg.load(None, {"effective_batch_size": 1000})
    # auto given on top of a config keeps the batch it implies (test_config.py); a config
    # that itself says auto must state the batch
    assert cfg.load(None, {"micro_batch_size": "auto"}).effective_batch_size == 512
    with pytest.raises(cfg.ConfigError, match="micro_batch_size='auto': needs "
                       "effective_batch_size"):
        cfg.build({"micro_batch_size": "auto"})


# ------------------------------------------------------------------ probe and choice


def test_candidates_halve_the_effective_batch():
    assert candidates(512) == [512, 256, 128, 64, 32, 16, 8]
    assert candidates(6) == [6]


def test_choose_split_takes_the_largest_micro_that_fits_and_k_covers_b():
    table = [ProbeRow(64, 10 * 2**20, 0.01), ProbeRow(128, 20 * 2**20, 0.01),
             ProbeRow(256, 40 * 2**20, 0.01), ProbeRow(512, -1, float("inf"))]  # 512: OOM
    assert choose_split(512, 2**40, table) == (256, 2)
    assert choose_split(512, 25 * 2**20, table) == (128, 4)
    assert choose_split(500, 25 * 2**20, table) == (128, 4)  # last micro-batch short
    with pytest.raises(ValueError, match=r"memory_budget=5.0MiB: below every candidate "
                       r"micro-batch size \(the smallest measured peak is 10.0MiB at "
                       r"micro_batch_size=64\)"):
        choose_split(512, 5 * 2**20, table)


def test_probe_measures_peak_memory_that_grows_with_the_micro_batch():
    torch.manual_seed(0)
    x, y = torch.randn(4096, 16), torch.rand(4096)

    def wide():  # few weights (0.3 MiB), wide activations: 4096 x 4096 floats = 64 MiB each
        return nn.Sequential(nn.Linear(16, 4096), nn.ReLU(), nn.Linear(4096, 1), nn.Flatten(0))

    before = torch.get_rng_state()
    table = probe(wide, (x, y), StepSettings(CPU_FP32), [4096, 256])
    assert torch.equal(torch.get_rng_state(), before)  # the run's random stream is untouched
    assert [row.micro_batch_size for row in table] == [256, 4096]
    small, large = table[0].peak_bytes, table[1].peak_bytes
    assert small < 32 * 2**20
    assert large > small + 96 * 2**20  # the saved activation and its gradient are resident
    assert all(row.samples_per_second > 0 for row in table)


@pytest.fixture(scope="module")
def fd001_data(fd001):
    config = cfg.load(None, SMALL)
    return prepared(config, fd001)


def test_auto_picks_a_smaller_micro_under_a_tiny_budget_and_says_when_nothing_fits(fd001_data):
    base = cfg.load(None, {**SMALL, "micro_batch_size": "auto", "effective_batch_size": 1024})
    large, chosen = auto_split(base.replace(memory_budget="64GiB"), fd001_data)
    assert (large.micro_batch_size, large.accumulation_steps) == (1024, 1)
    assert chosen.table[-1].micro_batch_size == 1024 and chosen.peak_bytes > 0
    peaks = {row.micro_batch_size: row.peak_bytes for row in chosen.table}
    budget = (peaks[64] + peaks[1024]) // 2  # well between: 1024 does not fit
    small, _ = auto_split(base.replace(memory_budget=budget), fd001_data)
    assert small.micro_batch_size < 1024
    assert small.accumulation_steps == 1024 // small.micro_batch_size
    assert small.effective_batch_size == 1024
    with pytest.raises(cfg.ConfigError, match=r"memory_budget=1.0KiB: below every candidate "
                       r"micro-batch size \(the smallest measured peak is .* at "
                       r"micro_batch_size=\d+\)"):
        auto_split(base.replace(memory_budget="1KiB"), fd001_data)


@pytest.fixture
def small_data(write_cmapss):
    """Synthetic C-MAPSS: 16 training units of 90 cycles, window 20 (~900 training windows)."""
    folder = write_cmapss(train_lengths=(90,) * 16)
    config = cfg.load(None, {**SMALL, "window": 20, "data_dir": str(folder)})
    return config, prepared(config)


def test_same_effective_batch_under_different_budgets_reaches_the_same_val_rmse(small_data):
    config, data = small_data
    base = config.replace(micro_batch_size="auto", effective_batch_size=256, epochs=3,
                          precision="fp32", device="cpu", filters=32)
    _, chosen = auto_split(base.replace(memory_budget="64GiB"), data)
    peaks = {row.micro_batch_size: row.peak_bytes for row in chosen.table}
    small, _ = auto_split(base.replace(memory_budget=(peaks[32] + peaks[256]) // 2), data)
    outcomes = [train(plan_run(base.replace(memory_budget="64GiB"), data=data), progress=False),
                train(plan_run(small, data=data), progress=False)]  # auto resolved there
    splits = [(o.plan.config.micro_batch_size, o.plan.config.accumulation_steps) for o in outcomes]
    assert splits[0] == (256, 1) and splits[1][0] < 256, splits
    a, b = (o.state.best_val_rmse for o in outcomes)
    assert abs(a - b) / a < 1e-4, (splits, a, b)
    assert outcomes[0].state.step == outcomes[1].state.step


# ------------------------------------------------------------------ out-of-memory back-off


class OutOfMemoryAbove(nn.Module):
    """Test hook: a model that runs out of memory on training micro-batches above `limit`.
    With `every_second`, an oversized micro-batch fits once and the next one fails, so the
    error comes mid-accumulation, after earlier micro-batches' gradients were accumulated."""

    def __init__(self, model: nn.Module, limit: int, every_second: bool = False):
        super().__init__()
        self.model, self.limit, self.every_second, self.oversized = model, limit, every_second, 0

    def forward(self, x):
        out = self.model(x)  # runs (and draws dropout masks), then "runs out" mid-forward
        if self.training and len(x) > self.limit:
            self.oversized += 1
            if not self.every_second or self.oversized % 2 == 0:
                raise torch.OutOfMemoryError(f"test: micro-batch {len(x)} > {self.limit}")
        return out


class StepLosses(TrainingListener):
    def __init__(self):
        self.losses = []

    def on_step(self, step, result) -> None:
        self.losses.append(result.loss)


def _fit(data, config, limit=None):
    from rul.plan import network_of

    seeds = seed_everything(config.seed, config.deterministic)
    model = network_of(config, data.preprocessor.n_features).build()
    if limit is not None:
        model = OutOfMemoryAbove(model, limit, every_second=True)
    listener = StepLosses()
    state = fit(model, fit_plan(config, data.train, data.val, seeds, CPU_FP32), listener,
                progress=False)
    return state, listener.losses


def test_out_of_memory_halves_the_micro_batch_and_keeps_every_step(small_data):
    config, data = small_data
    config = config.replace(epochs=2, micro_batch_size=128, accumulation_steps=2,
                            precision="fp32")
    backed_off, losses = _fit(data, config, limit=40)  # 128x2 -> 64x4 -> 32x8 (B = 256)
    reference, expected = _fit(data, config.replace(micro_batch_size=32, accumulation_steps=8))
    assert backed_off.step == reference.step == len(expected) == len(losses)
    assert losses == pytest.approx(expected, rel=1e-6)
    assert backed_off.best_val_rmse == pytest.approx(reference.best_val_rmse, rel=1e-6)
    assert [(h["micro_batch_size"], h["accumulation_steps"]) for h in backed_off.history] == [
        (32, 8), (32, 8)]  # the event, as per-epoch metrics


def test_with_dropout_the_micro_batch_split_does_not_change_the_training(write_cmapss):
    """The DCNN's dropout masks (models/dropout.py) are drawn row by row: 125 x 2 and 50 x 5
    draw the same masks, so the same effective batch of 250 trains the same network. Rows of
    21 x 14 values (no multiple of 16) and micro-batches of no multiple of 8 windows: masks
    drawn from a flat stream of words would differ."""
    folder = write_cmapss(train_lengths=(90,) * 16)
    config = cfg.load(None, {**SMALL, "window": 21, "data_dir": str(folder), "dropout": 0.5,
                             "epochs": 2, "precision": "fp32", "micro_batch_size": 125,
                             "accumulation_steps": 2})
    data = prepared(config)
    _, losses = _fit(data, config)
    _, expected = _fit(data, config.replace(micro_batch_size=50, accumulation_steps=5))
    assert len(losses) == len(expected) == 8  # 2 epochs of 4 steps
    assert losses == pytest.approx(expected, rel=1e-4)


def test_back_off_redoes_the_batch_from_its_start_with_the_same_random_stream():
    torch.manual_seed(0)
    model = OutOfMemoryAbove(nn.Sequential(nn.Dropout(0.5), nn.Linear(4, 1), nn.Flatten(0)), 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    values = torch.randn(8, 4)

    class Rows:  # WindowBatches' get(): (x, y) for a tensor of indices
        def get(self, index):
            return values[index], torch.zeros(len(index))

    settings = StepSettings(CPU_FP32, max_grad_norm=None)
    step = BackoffStep(Rows(), settings, micro_batch_size=8, effective_batch_size=8)
    state = torch.get_rng_state()
    result = step(model, optimizer, CPU_FP32.grad_scaler(), torch.arange(8))
    assert (step.micro_batch_size, step.accumulation_steps) == (2, 4)
    assert step.backoffs == [(4, 2), (2, 4)]
    # the same as micro 2 from the start, from the same random state
    torch.manual_seed(0)
    fresh = OutOfMemoryAbove(nn.Sequential(nn.Dropout(0.5), nn.Linear(4, 1), nn.Flatten(0)), 3)
    torch.set_rng_state(state)
    again = BackoffStep(Rows(), settings, 2, 8)(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1),
                                                CPU_FP32.grad_scaler(), torch.arange(8))
    assert result.loss == pytest.approx(again.loss, rel=1e-7)
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(p, q)


def test_out_of_memory_at_micro_batch_one_is_raised():
    model = OutOfMemoryAbove(nn.Sequential(nn.Linear(4, 1), nn.Flatten(0)), 0)

    class Rows:
        def get(self, index):
            return torch.ones(len(index), 4), torch.zeros(len(index))

    with pytest.raises(torch.OutOfMemoryError):
        BackoffStep(Rows(), StepSettings(CPU_FP32, max_grad_norm=None), 4, 4)(
            model, torch.optim.SGD(model.parameters(), lr=0.1), CPU_FP32.grad_scaler(),
            torch.arange(4))


# ------------------------------------------------------------------ bench


# Imported first by every interpreter that has it on its path: the bench's own process and
# the processes it spawns (bench speed runs each path in one) cannot import these (the
# recipe's home, TrainConfig, needs pydantic: a GPU machine is given its wheel).
BLOCKING_SITECUSTOMIZE = ("import sys\n"
                          "for name in ('mlflow', 'optuna'):\n"
                          "    sys.modules[name] = None  # import of these raises ImportError\n")


def run_bench_without_mlflow_and_optuna(name: str, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKING_SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "CUDA_VISIBLE_DEVICES": ""}  # CPU rows only: with a GPU the reference is CUDA's
    done = subprocess.run([sys.executable, "-m", "bench", name, "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow  # ~20-70 s on 2 shared cores: bf16 on CPU is slow
def test_memory_bench_runs_without_mlflow_and_optuna(tmp_path):
    done = run_bench_without_mlflow_and_optuna("memory", tmp_path)
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("cpu ")]
    # device precision micro K peak_MiB samples/s peak_ratio speed_ratio
    assert [(r[1], int(r[2]), int(r[3])) for r in rows] == [
        (p, m, 512 // m) for p in ("fp32", "bf16") for m in (512, 256, 128, 64)]
    for r in rows:
        assert float(r[4]) > 0 and float(r[5]) > 0
        if int(r[2]) == 512:
            assert (float(r[6]), float(r[7])) == (1.0, 1.0)  # ratios to (512, 1)


@pytest.mark.slow  # ~20-60 s on 2 shared cores: bf16 on CPU is slow
def test_speed_bench_runs_without_mlflow_and_optuna(tmp_path):
    done = run_bench_without_mlflow_and_optuna("speed", tmp_path)
    lines = done.stdout.splitlines()
    rows = {line[:30].strip(): line[30:].split() for line in lines if line.startswith("cpu ")}
    # bf16 with glibc's own malloc settings only where bf16 is native (emulated, no one takes it)
    assert list(rows) == ["cpu fp32 eager, before", "cpu fp32 eager, conv",
                          "cpu fp32 banded, std malloc", "cpu fp32 eager",
                          "cpu bf16 autocast, bernoulli_", "cpu bf16 autocast",
                          *["cpu bf16 autocast, std malloc"] * cpu_has_native_bf16()]
    assert rows["cpu fp32 eager, before"][3] == "1.00"  # the reference
    # the last line is the ratio of the path `auto` takes on this CPU (bf16 autocast where the
    # CPU has native bf16, fp32 eager otherwise) to the reference
    chosen = "cpu bf16 autocast" if cpu_has_native_bf16() else "cpu fp32 eager"
    assert lines[-1] == f"speed ratio: {rows[chosen][3]}"

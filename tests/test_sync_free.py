"""The sync-free step (what a CUDA run trains with), run on the CPU: the fused AdamW takes the
skip decision as a tensor, the schedule and the weight average follow it on the device, and the
step's record is read once per epoch. It must train what the host's step trains (within
float rounding: fused and unfused AdamW round differently), and a checkpoint must move between
the two. The CUDA graph around it is checked where CUDA is (tests/test_gpu.py)."""

import copy
import functools
import math
from dataclasses import astuple, replace

import pytest
import torch
from conftest import fit_plan

from rul import config as cfg
from rul.plan import network_of, optimizer_settings, step_settings
from rul.training import engine, optim
from rul.training.backoff import BackoffStep
from rul.training.batching import WindowBatches
from rul.training.engine import fit
from rul.training.listener import TrainingListener
from rul.training.optim import make_optimizer, make_scheduler
from rul.training.precision import resolve_precision
from rul.training.seeding import derive_seeds
from rul.training.step import StepResult, decides_on_device, optimizer_step
from rul.training.sync_free import DeviceSchedule, StepLog, host_optimizer

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def windows(real_data_dir):
    """4096 training and 512 validation windows of FD001 (8 steps of 512 per epoch)."""
    from rul.plan import prepared
    from rul.training.seeding import derive_seeds

    prepared = prepared(cfg.load(None, {"data_dir": str(real_data_dir)}), derive_seeds(0).split)
    return head(prepared.train, 4096), head(prepared.val, 512)


def head(windows, n: int):
    return replace(windows, starts=windows.starts[:n], targets=windows.targets[:n],
                   units=windows.units[:n])


def tiny(**changes):
    return cfg.load(None, {"model": "cnn", "filters": 4, "num_layers": 2, "hidden_size": 16,
                           "dropout": 0.0, "epochs": 2, "micro_batch_size": 256,
                           "accumulation_steps": 2, "device": "cpu", "ema_decay": 0.9,
                           "optimizer": "adamw", "warmup_epochs": 0, **changes})


class Steps(TrainingListener):
    def __init__(self):
        self.results = []

    def on_step(self, step, result):
        self.results.append(result)


def poison_backward(model, number: int):
    """Make backward call `number` (1-based; one per micro-batch) give an inf gradient."""
    param, calls = next(model.parameters()), []

    def hook(grad):
        calls.append(1)
        return grad * math.inf if len(calls) == number else grad

    param.register_hook(hook)


def train(config, windows, sync_free: bool, monkeypatch, poison=None, **kwargs):
    monkeypatch.setattr(optim, "make_optimizer",
                        functools.partial(make_optimizer, sync_free=sync_free))
    torch.manual_seed(0)
    model = network_of(config, 14).build()
    if poison:
        poison_backward(model, poison)
    steps = Steps()
    state = fit(model, fit_plan(config, *windows, derive_seeds(7), **kwargs), steps,
                progress=False)
    return state, steps.results, model


def test_the_optimizer_decides_on_the_device_when_sync_free_and_not_with_onecycle():
    model = network_of(tiny(), 14).build()
    settings = optimizer_settings(tiny())
    assert not decides_on_device(make_optimizer(model, settings))  # a CPU run: as ever
    assert decides_on_device(make_optimizer(model, settings, sync_free=True))
    one_cycle = optimizer_settings(tiny(scheduler="onecycle", warmup_epochs=0))
    assert not decides_on_device(make_optimizer(model, one_cycle,
                                                sync_free=True))  # beta1 moves: host


@pytest.mark.parametrize("precision, scheduler, warmup", [
    ("fp32", "cosine", 0), ("fp16", "cosine", 0), ("fp32", "cosine", 1), ("fp32", "none", 1)])
def test_the_sync_free_step_trains_what_the_host_step_trains(windows, monkeypatch, precision,
                                                             scheduler, warmup):
    """Cosine schedule (or a warm-up, then the cosine or a constant rate), weight average and a
    skipped second step (an inf gradient in its first micro-batch): the same steps are
    skipped, the rates are the host scheduler's, and losses, weights and the weight average
    agree up to fused AdamW's rounding."""
    config = tiny(precision=precision, scheduler=scheduler, warmup_epochs=warmup)
    host, host_steps, host_model = train(config, windows, False, monkeypatch, poison=3)
    device, device_steps, device_model = train(config, windows, True, monkeypatch, poison=3)
    assert host.step == device.step == 16 and host.skipped_steps == device.skipped_steps >= 1
    assert [r.skipped for r in device_steps] == [r.skipped for r in host_steps]
    assert device_steps[1].skipped and not math.isfinite(device_steps[1].grad_norm)
    assert [r.scale for r in device_steps] == [r.scale for r in host_steps]
    assert [r.lr for r in device_steps] == pytest.approx([r.lr for r in host_steps], rel=1e-6)
    assert device_steps[2].lr == device_steps[1].lr  # the skipped step moved no schedule
    assert [r.loss for r in device_steps] == pytest.approx([r.loss for r in host_steps],
                                                           rel=1e-3)
    assert device.grad_norms[1:] == pytest.approx(host.grad_norms[1:], rel=1e-3)
    assert [h["val_rmse"] for h in device.history] == pytest.approx(
        [h["val_rmse"] for h in host.history], rel=1e-4)
    for name, value in host_model.state_dict().items():  # the returned model: the average
        torch.testing.assert_close(device_model.state_dict()[name], value, rtol=1e-3,
                                   atol=1e-5)



def test_muons_sync_free_step_trains_what_the_host_step_trains_bit_for_bit(windows,
                                                                           monkeypatch):
    """make train's optimizer (Muon, AdamW for the rest) in fp32 with a warm-up, then the
    cosine, the weight average, clipping and a skipped second step: on the CPU the step
    decided on the device is the host's arithmetic with its numbers as tensors, so every
    step's record, every epoch's validation and the returned weights are the host's, bit for
    bit (half precision: the next test)."""
    config = tiny(optimizer="muon", precision="fp32", warmup_epochs=1)
    assert decides_on_device(make_optimizer(network_of(config, 14).build(),
                                            optimizer_settings(config), sync_free=True))
    host, host_steps, host_model = train(config, windows, False, monkeypatch, poison=3)
    device, device_steps, device_model = train(config, windows, True, monkeypatch, poison=3)
    assert host.step == device.step == 16 and device_steps[1].skipped
    assert any(r.clipped for r in host_steps) and not all(r.clipped for r in host_steps)
    assert len({r.lr for r in host_steps}) > 8  # the schedule moved the rate
    assert [repr(astuple(r)) for r in device_steps] == [repr(astuple(r)) for r in host_steps]
    assert [(h["train_loss_epoch"], h["val_rmse"]) for h in device.history] == [
        (h["train_loss_epoch"], h["val_rmse"]) for h in host.history]
    for name, value in host_model.state_dict().items():  # the returned model: the average
        assert torch.equal(device_model.state_dict()[name], value), name



@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_muons_sync_free_step_is_the_hosts_bit_for_bit_in_every_precision(precision):
    """Eight steps of Muon (with its floor in bf16 and fp16) by the host and decided on the
    device, the rates a warm-up's and the cosine's, the fourth step's input inf (skipped:
    fp16 by the GradScaler's found_inf, the others by the gradient norm's): the same records
    and weights, bit for bit (bf16's documented tolerance on the CPU: none; both paths
    autocast alike)."""
    config = tiny(optimizer="muon", precision=precision, warmup_epochs=1, weight_decay=0.1,
                  filters=4, hidden_size=8)
    step = step_settings(config, resolve_precision(precision, CPU))
    settings = optimizer_settings(config, step.precision)
    torch.manual_seed(0)
    host_model = network_of(config, 5).build()
    device_model = copy.deepcopy(host_model)
    host = make_optimizer(host_model, settings)
    device = make_optimizer(device_model, settings, sync_free=True)
    scheduler = make_scheduler(host, settings, 8)
    schedule = DeviceSchedule(device, lambda o: make_scheduler(o, settings, 8), 8, config.lr)
    assert ("floor" in device.param_groups[0]) == (precision != "fp32")
    host_scaler, device_scaler = step.precision.grad_scaler(), step.precision.grad_scaler()
    hosts, devices = [], []
    for i in range(8):
        generator = torch.Generator().manual_seed(i)
        x, y = torch.randn(64, 30, 5, generator=generator), torch.rand(64, generator=generator)
        if i == 3:
            x[0, 0, 0] = math.inf
        hosts.append(optimizer_step(host_model, host, host_scaler, [(x, y * 125)], step))
        devices.append(optimizer_step(device_model, device, device_scaler, [(x, y * 125)],
                                      step))
        if hosts[-1].stepped:
            scheduler.step()
        schedule.after_step(~devices[-1].stepped)
    assert decides_on_device(device) and hosts[3].skipped
    assert [repr(astuple(r.member(0))) for r in devices] == [repr(astuple(r)) for r in hosts]
    for name, value in host_model.state_dict().items():
        assert torch.equal(device_model.state_dict()[name], value), name


def test_a_skipped_sync_free_step_changes_no_weight_and_no_average(windows, monkeypatch):
    config = tiny(epochs=1, precision="fp32")
    monkeypatch.setattr(optim, "make_optimizer",
                        functools.partial(make_optimizer, sync_free=True))
    torch.manual_seed(0)
    model = network_of(config, 14).build()
    poison_backward(model, 5)  # the third step's first micro-batch
    precision = resolve_precision("fp32", CPU)
    parts = optim.TrainingParts(model, optimizer_settings(config), precision, 8)
    step = BackoffStep(WindowBatches(windows[0], CPU), step_settings(config, precision), 256,
                       512)

    def take_step(indices):
        result = step(model, parts.optimizer, parts.scaler, indices)
        parts.after_step(result)
        return result

    assert not bool(take_step(torch.arange(512)).skipped)  # the average copies the weights
    assert not bool(take_step(torch.arange(512, 1024)).skipped)  # then moves by 1 - d
    before = {k: v.clone() for k, v in model.state_dict().items()}
    average = {k: v.clone() for k, v in parts.average.module.state_dict().items()}
    assert any(not torch.equal(average[k], before[k]) for k in before)  # d < 1 apart
    result = take_step(torch.arange(1024, 1536))
    assert isinstance(result.skipped, torch.Tensor) and bool(result.skipped)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    for name, value in parts.average.module.state_dict().items():
        assert torch.equal(value, average[name]), name
    assert int(parts.average.n_averaged) == 2
    assert all(int(s["step"]) == 2 for s in parts.optimizer.state.values())


def test_the_device_schedule_holds_the_host_schedulers_rates_and_catches_it_up():
    config = tiny(scheduler="cosine")
    model = network_of(config, 14).build()
    optimizer = make_optimizer(model, optimizer_settings(config), sync_free=True)
    settings = optimizer_settings(config)
    schedule = DeviceSchedule(optimizer, lambda o: make_scheduler(o, settings, 10), 10,
                              config.lr)
    reference = make_scheduler(host_optimizer(config.lr), optimizer_settings(config), 10)
    rates = []
    with pytest.warns(UserWarning, match="before `optimizer.step"):  # it never steps
        for _ in range(10):
            rates.append(reference.get_last_lr()[0])
            reference.step()
    assert schedule.rates[:10].tolist() == torch.tensor(rates, dtype=torch.float32).tolist()
    for skipped in (False, True, False, False):
        schedule.after_step(torch.tensor(skipped))
    assert float(optimizer.param_groups[0]["lr"]) == pytest.approx(rates[3], rel=1e-7)
    assert schedule.scheduler.last_epoch == 0
    schedule.sync()
    assert schedule.scheduler.last_epoch == 3
    assert schedule.scheduler.get_last_lr()[0] == rates[3]


@pytest.mark.parametrize("first, then, optimizer", [(False, True, "adamw"),
                                                     (True, False, "adamw"),
                                                     (True, False, "muon")])
def test_a_checkpoint_moves_between_a_host_run_and_a_sync_free_run(windows, monkeypatch,
                                                                   first, then, optimizer):
    """A run checkpointed on a CPU resumes on a GPU and the other way round (here: the two
    step kinds on the CPU): it ends where the uninterrupted run ends, within rounding (Muon's:
    none)."""
    config = tiny(epochs=3, scheduler="cosine", precision="fp32", optimizer=optimizer)
    reference, _, reference_model = train(config, windows, first, monkeypatch)

    class StopAfterTwo(TrainingListener):
        def on_epoch(self, epoch, step, metrics):
            if epoch == 2:
                raise KeyboardInterrupt

    saved = {}

    class Keep:
        def save(self, parts, state):
            saved.update(copy.deepcopy({**parts.state_dict(), "train_state": state.as_dict(),
                                        "rng": {"python": None}}))

    monkeypatch.setattr(optim, "make_optimizer",
                        functools.partial(make_optimizer, sync_free=first))
    torch.manual_seed(0)
    model = network_of(config, 14).build()
    with pytest.raises(KeyboardInterrupt):
        fit(model, fit_plan(config, *windows, derive_seeds(7)), StopAfterTwo(), Keep(),
            progress=False)
    monkeypatch.setattr(engine.checkpoint, "restore_rng_state", lambda state: None)
    resumed, _, resumed_model = train(config, windows, then, monkeypatch,
                                      resume=saved)
    assert resumed.step == reference.step == 24
    assert [h["val_rmse"] for h in resumed.history] == pytest.approx(
        [h["val_rmse"] for h in reference.history], rel=1e-4)
    exact = optimizer == "muon"
    for name, value in reference_model.state_dict().items():
        torch.testing.assert_close(resumed_model.state_dict()[name], value,
                                   rtol=0 if exact else 1e-3, atol=0 if exact else 1e-5)


def test_the_step_log_reads_each_steps_record_back_in_order():
    log = StepLog()
    for i in range(3):
        log.add(StepResult(loss=torch.tensor(0.5 * i), grad_norm=torch.tensor(float(i)),
                           clipped=torch.tensor(i == 1), skipped=torch.tensor(i == 2),
                           lr=torch.tensor(1e-3), scale=1.0), CPU)
    read = log.read()
    assert [(r.loss, r.grad_norm, r.clipped, r.skipped, r.scale) for r in read] == [
        (0.0, 0.0, False, False, 1.0), (0.5, 1.0, True, False, 1.0),
        (1.0, 2.0, False, True, 1.0)]
    assert read[0].lr == pytest.approx(1e-3) and log.read() == []

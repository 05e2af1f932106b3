"""The training contract: exact accumulation, AMP skip/scale behaviour, clipping, scheduler."""

import math

import pytest
import torch
from conftest import fit_plan
from torch import nn

from rul import config as cfg
from rul.models.spec import KINDS
from rul.plan import cpu_measured, network_of, optimizer_settings
from rul.training.batching import WindowBatches, effective_batches
from rul.training.engine import TrainState, fit
from rul.training.listener import TrainingListener
from rul.training.precision import Precision, resolve_precision
from rul.training.step import StepSettings, optimizer_step, rul_loss

CPU = torch.device("cpu")
FP32 = resolve_precision("fp32", CPU)


@pytest.fixture(scope="module")
def fd001_windows(real_data_dir):
    """Real FD001 train/validation windows (split by unit)."""
    from rul.plan import prepared
    from rul.training.seeding import derive_seeds

    config = cfg.load(None, {"data_dir": str(real_data_dir)})
    prepared = prepared(config, derive_seeds(0).split)
    return prepared.train, prepared.val


def tiny_model(seed=0, model="transformer"):
    torch.manual_seed(seed)
    config = cfg.load(None, {"model": model, "hidden_size": 16, "num_heads": 2, "num_layers": 2,
                             "dropout": 0.0, "window": 12, "filters": 4, "kernel_size": 3})
    return network_of(config, 5).build()


def data(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, 5, generator=g), torch.rand(n, generator=g) * 125


def near_targets(x, seed=2):
    """Targets close to an untrained model's output: small losses, no fp16 overflow."""
    with torch.no_grad():
        out = tiny_model()(x)
    return out + 10 * torch.randn(len(x), generator=torch.Generator().manual_seed(seed))


class GradCapture(torch.optim.SGD):
    """SGD that remembers the (unscaled, clipped) gradients it stepped with."""

    def step(self, closure=None):
        self.grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        return super().step(closure)


def step_with(model, x, y, micro, precision=FP32, max_grad_norm=None, lr=0.1):
    """One SGD step over (x, y) split into micro-batches of `micro`."""
    optimizer = GradCapture(model.parameters(), lr=lr)
    scaler = precision.grad_scaler()
    micro_batches = list(zip(x.split(micro), y.split(micro)))
    result = optimizer_step(model, optimizer, scaler, micro_batches,
                            StepSettings(precision, max_grad_norm, target_scale=125.0))
    step_with.grads = getattr(optimizer, "grads", None)
    return result, {k: v.clone() for k, v in model.state_dict().items()}, scaler


def assert_same_gradients(a, b, rel=1e-5):
    for ga, gb in zip(a, b):
        assert ((ga - gb).norm() / gb.norm().clamp_min(1e-12)).item() < rel


@pytest.mark.parametrize("model_name", KINDS)
@pytest.mark.parametrize("n,micro", [(300, 128), (256, 64), (97, 40)])
def test_accumulated_gradient_equals_one_large_batch(model_name, n, micro):
    """Including a partial last micro-batch (300 = 128+128+44): weighted by share, not ÷K."""
    x, y = data(n)
    big_result, _, _ = step_with(tiny_model(model=model_name), x, y, micro=n)
    big_grads = step_with.grads
    acc_result, _, _ = step_with(tiny_model(model=model_name), x, y, micro=micro)
    assert_same_gradients(step_with.grads, big_grads)
    assert acc_result.loss == pytest.approx(big_result.loss, rel=1e-5)
    assert acc_result.grad_norm == pytest.approx(big_result.grad_norm, rel=1e-4)
    # the recorded loss is the mean over all samples, not the last micro-batch's
    with torch.no_grad():
        full_loss = nn.functional.mse_loss(tiny_model(model=model_name)(x) / 125, y / 125).item()
    assert acc_result.loss == pytest.approx(full_loss, rel=1e-5)


def manual_accumulation(x, y, micro, weight):
    """Gradients of sum_i weight(len(batch_i)) * MSE_i(pred/125, y/125), by hand."""
    model = tiny_model()
    for xb, yb in zip(x.split(micro), y.split(micro)):
        (nn.functional.mse_loss(model(xb) / 125, yb / 125) * weight(len(yb))).backward()
    return [p.grad for p in model.parameters()]


def test_dividing_by_k_on_a_short_last_batch_would_differ():
    """Guard that the test above can fail: on the same (÷125) loss, weighting micro-batches by
    their share of the samples is what the step does, and plain ÷K is a different gradient."""
    x, y = data(300)  # 128 + 128 + 44
    step_with(tiny_model(), x, y, micro=128)
    accumulated = step_with.grads
    assert_same_gradients(manual_accumulation(x, y, 128, lambda n: n / 300), accumulated)
    with pytest.raises(AssertionError):
        assert_same_gradients(manual_accumulation(x, y, 128, lambda n: 1 / 3), accumulated)


def test_a_range_target_costs_the_squared_distance_to_it():
    """Engines in service (censored_training: lower_bound): a target [lower, upper] costs
    nothing inside, the squared distance outside, and a range of one value is the MSE."""
    predicted = torch.tensor([10.0, 50.0, 130.0, 100.0])
    known = torch.tensor([20.0, 50.0, 125.0, 90.0])
    assert rul_loss(predicted, torch.stack([known, known]), 125.0).item() == pytest.approx(
        rul_loss(predicted, known, 125.0).item(), rel=1e-7)
    lower, upper = torch.tensor([20.0, 40.0, 100.0, 90.0]), torch.tensor([125.0] * 3 + [90.0])
    expected = ((20 - 10) ** 2 + 0 + (130 - 125) ** 2 + (100 - 90) ** 2) / 4 / 125 ** 2
    assert rul_loss(predicted, torch.stack([lower, upper]), 125.0).item() == pytest.approx(
        expected, rel=1e-6)
    stacked = rul_loss(torch.stack([predicted, predicted + 5]),  # members: one loss each
                       torch.stack([torch.stack([lower] * 2), torch.stack([upper] * 2)]), 125.0)
    assert stacked.shape == (2,) and stacked[0].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("n,micro", [(300, 128), (97, 40)])
def test_accumulation_is_exact_with_range_targets(n, micro):
    """Ranges split with their samples (the last axis): micro-batches weighted by their share
    give the gradient of one large batch, the last short one too."""
    x, y = data(n)
    third = torch.arange(n) % 3 == 0  # a third are ranges that hold the untrained model's
    ranges = torch.stack([torch.where(third, torch.full_like(y, -500), y),
                          torch.where(third, torch.full_like(y, 125), y)])
    steps = []
    for size in (n, micro):
        model = tiny_model()
        optimizer = GradCapture(model.parameters(), lr=0.1)
        result = optimizer_step(model, optimizer, FP32.grad_scaler(),
                                list(zip(x.split(size), ranges.split(size, dim=-1))),
                                StepSettings(FP32, None, target_scale=125.0))
        steps.append((result, optimizer.grads))
    assert_same_gradients(steps[1][1], steps[0][1])
    assert steps[1][0].loss == pytest.approx(steps[0][0].loss, rel=1e-5)
    with torch.no_grad():  # those cost nothing: less than the MSE to `y`
        assert steps[0][0].loss < 0.8 * rul_loss(tiny_model()(x), y, 125.0).item()


def test_effective_batches_do_not_depend_on_the_split():
    """The batches are drawn for the effective batch alone (the step splits each into
    micro-batches itself), and N ranks share each one of them."""
    from rul.training.distributed import World

    for epoch in range(2):
        batches = list(effective_batches(1100, 512, seed=7, epoch=epoch))
        assert [len(b) for b in batches] == [512, 512, 76]  # a short last effective batch
        assert [len(mb) for mb in batches[-1].split(128)] == [76]
        shares = [list(effective_batches(1100, 512, 7, epoch, World(r, 2, r))) for r in (0, 1)]
        for batch, *parts in zip(batches, *shares, strict=True):
            assert torch.equal(torch.cat(parts).sort().values, batch.sort().values)
    first = [next(effective_batches(1100, 512, 7, e)) for e in (0, 1)]
    assert not torch.equal(first[0], first[1])  # a new order each epoch


def parameter_update(before: dict, after: dict, model) -> list[torch.Tensor]:
    return [after[name] - before[name] for name, _ in model.named_parameters()]


def global_norm(tensors) -> float:
    return torch.stack([t.norm() for t in tensors]).norm().item()


def test_clipping_scales_the_whole_gradient_and_records_the_norm_before_clipping():
    x, y = data(64)
    free, before, _ = step_with(tiny_model(), x, y, micro=64, max_grad_norm=math.inf, lr=0.0)
    true_grads, true_norm = step_with.grads, free.grad_norm
    assert true_norm == pytest.approx(global_norm(true_grads), rel=1e-5)
    assert true_norm > 1.0 and not free.clipped
    model = tiny_model()
    result, after, _ = step_with(model, x, y, micro=32, max_grad_norm=0.05, lr=1.0)
    assert result.clipped
    assert result.grad_norm == pytest.approx(true_norm, rel=1e-5)  # recorded before clipping
    # SGD lr=1 from the same start (`before`: the lr=0 step changed nothing): the update is
    # minus the whole gradient scaled by 0.05 / norm, one factor for every parameter
    update = parameter_update(before, after, model)
    assert global_norm(update) == pytest.approx(0.05, rel=1e-4)
    for du, g in zip(update, true_grads, strict=True):
        torch.testing.assert_close(du, -g * (0.05 / true_norm), rtol=1e-3, atol=1e-7)


def test_fp16_clipping_sees_unscaled_gradients():
    """With a GradScaler (scale 65536), clipping must come after unscale_: then the update's
    norm is max_grad_norm and the recorded norm is fp32's, not 65536 times larger."""
    x, _ = data(128)
    y = near_targets(x)
    fp32_result, _, _ = step_with(tiny_model(), x, y, micro=64, lr=0.0)
    max_norm = fp32_result.grad_norm / 4
    precision = resolve_precision("fp16", CPU)
    assert precision.use_scaler
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result, after, scaler = step_with(model, x, y, micro=64, precision=precision,
                                      max_grad_norm=max_norm, lr=1.0)
    assert result.scale == 2.0**16 and not result.skipped and result.clipped
    assert result.grad_norm == pytest.approx(fp32_result.grad_norm, rel=0.1)  # autocast rounding
    assert global_norm(parameter_update(before, after, model)) == pytest.approx(max_norm, rel=1e-3)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_autocast_on_cpu_records_unscaled_grad_norm(dtype):
    x, _ = data(128)
    y = near_targets(x)
    fp32_result, _, _ = step_with(tiny_model(), x, y, micro=64)
    precision = resolve_precision(dtype, CPU)
    assert precision.use_scaler == (dtype == "fp16")
    result, _, scaler = step_with(tiny_model(), x, y, micro=64, precision=precision)
    assert not result.skipped
    # the recorded norm is that of the unscaled gradients the optimizer stepped with ...
    stepped_norm = torch.stack([g.norm() for g in step_with.grads]).norm().item()
    assert result.grad_norm == pytest.approx(stepped_norm, rel=1e-5)
    # ... which match fp32's up to autocast rounding (not 65536 times larger)
    assert result.grad_norm == pytest.approx(fp32_result.grad_norm, rel=0.1)
    if dtype == "fp16":
        assert result.scale == 2.0**16 and scaler.get_scale() == 2.0**16
    else:
        assert result.scale == 1.0
    for p in tiny_model().parameters():
        assert p.dtype == torch.float32  # parameters stay fp32


def poison_first_backward(model):
    """Make the first backward produce an inf gradient on one parameter."""
    calls = {"n": 0}
    param = next(model.parameters())

    def hook(grad):
        calls["n"] += 1
        return grad * math.inf if calls["n"] == 1 else grad

    param.register_hook(hook)
    return calls


def test_inf_gradient_skips_step_and_halves_scale():
    precision = Precision(CPU, "fp16", use_scaler=True)
    model = tiny_model()
    poison_first_backward(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, _ = data(64)
    y = near_targets(x)
    result, after, scaler = step_with(model, x, y, micro=32, precision=precision)
    assert result.skipped and not math.isfinite(result.grad_norm)
    assert scaler.get_scale() == result.scale / 2 == 2.0**15
    for name in before:
        assert torch.equal(before[name], after[name]), name
    result2, after2, _ = step_with(model, x, y, micro=32, precision=precision)
    assert not result2.skipped


def test_fit_counts_skipped_steps_and_does_not_advance_scheduler(fd001_windows):
    train, val = fd001_windows
    config = cfg.load(None, {"model": "cnn", "filters": 4, "num_layers": 2, "hidden_size": 16,
                             "dropout": 0.0, "epochs": 1, "scheduler": "cosine", "lr": 1e-3,
                             "warmup_epochs": 0, "micro_batch_size": 1024, "accumulation_steps": 2,
                             "precision": "fp16", "device": "cpu"})
    torch.manual_seed(0)
    model = network_of(config, 14).build()
    poison_first_backward(model)
    precision = resolve_precision("fp16", CPU)
    steps = []

    class Spy(TrainingListener):
        def on_step(self, step, result):
            steps.append(result)

    from rul.training.seeding import derive_seeds

    state = fit(model, fit_plan(config, train, val, derive_seeds(0), precision), Spy(),
                progress=False)
    assert isinstance(state, TrainState)
    assert state.skipped_steps == 1 and steps[0].skipped
    assert [s.scale for s in steps[:2]] == [2.0**16, 2.0**15]
    # cosine: lr after k real steps is lr * (1 + cos(pi k / T)) / 2; the skipped step is no k
    total = math.ceil(len(train) / 2048)
    assert steps[1].lr == pytest.approx(1e-3)  # scheduler did not move on the skipped step
    assert steps[2].lr == pytest.approx(1e-3 * (1 + math.cos(math.pi / total)) / 2)


def test_weight_average_follows_real_steps_only_and_is_what_fit_returns(fd001_windows):
    """ema_decay=d: validation and the returned model use w_avg <- d_n*w_avg + (1-d_n)*w after
    each real optimizer step, d_n = min(d, (1+n)/(10+n)) for the n-th update (the first real step
    copies w); a skipped fp16 step changes nothing."""
    train, val = fd001_windows
    decay = 0.3  # the warm-up (1+n)/(10+n) is below 0.3 for n = 1, 2, then 0.3 applies
    config = cfg.load(None, {"model": "cnn", "filters": 4, "num_layers": 2, "hidden_size": 16,
                             "dropout": 0.0, "epochs": 1, "ema_decay": decay,
                             "micro_batch_size": 1024, "accumulation_steps": 2,
                             "precision": "fp16", "device": "cpu"})
    torch.manual_seed(0)
    model = network_of(config, 14).build()
    poison_first_backward(model)
    snapshots, skipped = [], []

    class Spy(TrainingListener):
        def on_step(self, step, result):
            skipped.append(result.skipped)
            snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    from rul.training.seeding import derive_seeds

    state = fit(model, fit_plan(config, train, val, derive_seeds(0)), Spy(), progress=False)
    # the poisoned first step is skipped (the scaler may skip another while it finds its scale)
    assert skipped[0] and not all(skipped[1:]) and len(snapshots) == math.ceil(len(train) / 2048)
    expected, n = None, 0
    for weights, was_skipped in zip(snapshots, skipped, strict=True):
        if was_skipped:
            continue
        d = min(decay, (1 + n) / (10 + n))
        expected = ({k: v.clone() for k, v in weights.items()} if expected is None else
                    {k: d * expected[k] + (1 - d) * weights[k] for k in weights})
        n += 1
    raw = snapshots[-1]
    returned = model.state_dict()
    assert state.best_epoch == 1
    for key in expected:
        torch.testing.assert_close(returned[key], expected[key], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(raw[k], expected[k]) for k in expected)  # it is not the raw w
    with torch.inference_mode():  # as validated: float32 whatever trained it (as served)
        x, y = WindowBatches(val, CPU).get(torch.arange(len(val)))
        val_rmse = torch.sqrt(torch.mean((model.eval()(x).double() - y.double()) ** 2)).item()
    assert state.history[0]["val_rmse"] == pytest.approx(val_rmse, rel=1e-5)


@pytest.mark.parametrize("device, native_bf16, model, expected", [
    ("cpu", False, "cnn", ("fp32", False, "without native bf16")),
    ("cpu", True, "cnn", ("bf16", False, "same 5-seed accuracy")),
    ("cpu", True, "lstm", ("fp32", False, "measured for the DCNN only")),
    ("cuda 9.0", False, "cnn", ("bf16", False, "capability 9.0 (>= 8.0): bf16 autocast")),
    ("cuda 9.0", False, "lstm", ("fp16", True, "bf16 measured for the DCNN only")),
    ("cuda 7.5", False, "cnn", ("fp16", True, "7.5 < 8.0: no bf16 tensor cores")),
])
def test_auto_precision_says_what_it_picked_and_why(monkeypatch, device, native_bf16, model,
                                                    expected):
    from rul.training import hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native_bf16)
    if device.startswith("cuda"):  # a GPU of that compute capability, on any machine
        capability = tuple(int(part) for part in device.split()[1].split("."))
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: capability >= (8, 0))
        device = "cuda"
    precision = resolve_precision("auto", torch.device(device), model, probe=cpu_measured)
    assert (precision.name, precision.use_scaler) == expected[:2]
    assert expected[2] in precision.reason
    assert resolve_precision("bf16", CPU).reason == "asked for"
    with pytest.raises(TypeError, match="needs the model"):  # auto depends on it: no default
        resolve_precision("auto", torch.device(device))


RESUMED = "resumed: the run trained in "


@pytest.mark.parametrize("native_bf16, resumed, expected", [
    (True, "fp32", ("fp32", False, RESUMED + "fp32 (auto would pick bf16 here)")),
    (False, "bf16", ("bf16", False, RESUMED + "bf16 (auto would pick fp32 here)")),
    (True, "bf16", ("bf16", False, RESUMED + "bf16")),
    (False, "fp16", ("fp16", True, RESUMED + "fp16 (auto would pick fp32 here)")),
])
def test_a_resumed_auto_run_keeps_the_precision_it_trained_in(monkeypatch, native_bf16, resumed,
                                                              expected):
    """Another machine (or rul version) may make `auto` pick another precision: a resumed run
    goes on in its own (its checkpoint's), and says so. An explicit precision is as asked."""
    from rul.training import hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native_bf16)
    precision = resolve_precision("auto", CPU, "cnn", resumed=resumed, probe=cpu_measured)
    assert (precision.name, precision.use_scaler, precision.reason) == expected
    assert resolve_precision("fp32", CPU, "cnn", resumed="bf16").name == "fp32"


@pytest.mark.parametrize("sync_free", [False, True])
def test_fp16_splits_skip_the_same_steps_and_move_the_scale_alike(fd001_windows, sync_free,
                                                                  monkeypatch):
    """512 x 1, 256 x 2 and 128 x 4 under fp16 with a GradScaler: at the default initial
    scale the first step overflows fp16 in one micro-batch of 512 but not in two of 256. The
    scaler decides for the effective batch (precision.EffectiveBatchScaler), so every split
    skips that step and halves the scale alike, and their losses then agree to 1e-2. A stock
    GradScaler (the control below) skips only at 512 x 1 and the splits drift apart."""
    import functools
    from dataclasses import replace

    from rul.training import optim

    monkeypatch.setattr(optim, "make_optimizer",
                        functools.partial(optim.make_optimizer, sync_free=sync_free))
    train, val = (replace(w, starts=w.starts[:n], targets=w.targets[:n], units=w.units[:n])
                  for w, n in zip(fd001_windows, (4096, 512), strict=True))

    def run(micro, k):
        config = cfg.load(None, {"model": "cnn", "filters": 4, "num_layers": 2,
                                 "hidden_size": 16, "dropout": 0.0, "epochs": 1,
                                 "micro_batch_size": micro, "accumulation_steps": k,
                                 "optimizer": "adamw", "train_sampling": "windows",
                                 "precision": "fp16", "device": "cpu"})
        torch.manual_seed(0)
        steps = []

        class Spy(TrainingListener):
            def on_step(self, step, result):
                steps.append(result)

        from rul.training.seeding import derive_seeds

        fit(network_of(config, 14).build(), fit_plan(config, train, val, derive_seeds(7)),
            Spy(), progress=False)
        return steps

    runs = {split: run(*split) for split in ((512, 1), (256, 2), (128, 4))}
    reference = runs[(512, 1)]
    assert [s.skipped for s in reference][:2] == [True, False]
    for split, steps in runs.items():
        assert [s.skipped for s in steps] == [s.skipped for s in reference], split
        assert [s.scale for s in steps] == [s.scale for s in reference], split
        for step, ref in zip(steps, reference, strict=True):
            assert step.loss == pytest.approx(ref.loss, rel=1e-2), split

    stock = functools.partial(torch.amp.GradScaler, "cpu")
    monkeypatch.setattr(Precision, "grad_scaler", lambda self: stock())
    assert [s.skipped for s in run(256, 2)][0] is not reference[0].skipped


def rates_of(config, total_steps: int) -> list[float]:
    """The learning rate of each of `total_steps` steps under make_scheduler."""
    from rul.training.optim import make_scheduler

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=config.lr)
    scheduler = make_scheduler(optimizer, optimizer_settings(config), total_steps)
    rates = []
    for _ in range(total_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return rates


@pytest.mark.parametrize("scheduler", ["cosine", "none"])
def test_the_warm_up_rises_linearly_then_hands_over_to_the_schedule(scheduler):
    """warmup_epochs=2 of 10 over 100 steps: 20 steps rising to lr (the 20th at lr), then the
    cosine over the 80 left (CosineAnnealingLR's rates over 80 steps) or the constant lr."""
    lr = 1e-2
    config = cfg.load(None, {"epochs": 10, "warmup_epochs": 2, "lr": lr,
                             "scheduler": scheduler})
    rates = rates_of(config, 100)
    assert rates[:20] == pytest.approx([lr * (n + 1) / 20 for n in range(20)], rel=1e-12)
    after = (rates_of(config.replace(warmup_epochs=0, epochs=8), 80) if scheduler == "cosine"
             else [lr] * 80)
    assert rates[20:] == pytest.approx(after, rel=1e-9, abs=1e-15)


def test_without_a_warm_up_the_schedule_is_the_one_it_was():
    from rul.training.optim import make_scheduler

    config = cfg.load(None, {"epochs": 10, "lr": 1e-2, "warmup_epochs": 0})
    scheduler = make_scheduler(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-2), config,
                               100)
    assert type(scheduler) is torch.optim.lr_scheduler.CosineAnnealingLR  # rates bit for bit

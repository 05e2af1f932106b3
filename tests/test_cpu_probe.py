"""`precision: auto` on a CPU with native bf16 picks what this machine measured faster for
`make train`'s step (rul.training.cpu_probe, the step from rul.plan.recipe_step), not what its
flags suggest: once per machine and recipe, kept in a user cache under what decides the answer
(the CPU's model, its bf16/AMX flags, its cores, torch's build, the recipe's step) with the
load it was taken at; its figures in the reason; a precision asked for is taken without
measuring. The suite's other tests read fixed figures (conftest)."""

import dataclasses
import json

import pytest
import torch

import rul.plan
from rul import config as cfg
from rul.plan import cpu_measured, recipe_step
from rul.training import cpu_probe, hardware
from rul.training.precision import resolve_precision

CPU = torch.device("cpu")
XEON = {"fp32": 9301.0, "bf16": 6656.0}  # a 2-core Xeon with AVX512-BF16 and no AMX
EPYC = {"fp32": 11000.0, "bf16": 16229.0}
AMX = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
NO_AMX = "flags\t\t: avx2 avx512f avx512_bf16\n"


def auto(model: str = "cnn"):
    return resolve_precision("auto", CPU, model, probe=cpu_measured)


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """A CPU with native bf16, an empty cache, a quiet machine and a stand-in for the timed
    step whose figures the test sets; `probe.steps` lists the steps it was given."""
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(cpu_probe, "_load", lambda: 0.5)
    monkeypatch.setenv("RUL_PRECISION_CACHE", str(tmp_path / "cache" / "precision.json"))
    state = type("Probe", (), {"steps": [], "rates": XEON, "path": tmp_path / "cache"
                               / "precision.json"})()

    def measure(step):
        state.steps.append(step)
        return dict(state.rates)

    monkeypatch.setattr(cpu_probe, "measure_step", measure)
    return state


def test_auto_picks_the_precision_measured_faster_and_quotes_the_figures(probe):
    precision = auto()
    assert precision.name == "fp32"  # the flag says bf16; this machine's step says fp32
    assert "measured now): fp32 9,301 samples/s, bf16 6,656; fp32 is the faster" in \
        precision.reason
    assert cpu_probe.machine_key() in precision.reason
    kept = json.loads(probe.path.read_text())
    entry = kept[cpu_probe.cache_key(recipe_step())]
    assert (entry["fp32"], entry["load"], entry["cores"]) == (9301.0, 0.5,
                                                             hardware.usable_cpus())
    assert len(probe.steps) == 1

    again = auto()  # the next run: read, not measured
    assert again.name == "fp32" and len(probe.steps) == 1
    assert f"measured before, kept in {probe.path}" in again.reason


def test_where_bf16_is_faster_auto_picks_it(probe):
    probe.rates = EPYC
    precision = auto()
    assert precision.name == "bf16"
    assert "bf16 16,229 samples/s, fp32 11,000; bf16 is the faster at the same 5-seed " \
           "accuracy" in precision.reason


def test_the_probe_times_make_trains_step_and_follows_the_recipe(probe, monkeypatch):
    """The step timed is the recipe's one home's (TrainConfig's defaults): its network and
    optimizer; a recipe that moves is measured again, not read from the cache."""
    auto()
    (step,) = probe.steps
    recipe = cfg.TrainConfig()
    assert step.optimization.kind == recipe.optimizer == "muon"
    assert step.network.architecture["kernel_size"] == recipe.kernel_size
    assert (step.effective_batch_size, step.micro_batch_size) == (512, 256)
    assert step.network.n_features == 14  # FD001's informative sensors, the recipe's inputs

    class KernelOf9(cfg.TrainConfig):  # the recipe with another default kernel
        kernel_size: int = 9

    monkeypatch.setattr(rul.plan, "TrainConfig", KernelOf9)
    auto()
    assert len(probe.steps) == 2 and probe.steps[1].network.architecture["kernel_size"] == 9
    assert len(json.loads(probe.path.read_text())) == 2


@pytest.mark.parametrize("change", ["flags", "torch", "cores"])
def test_the_cache_tells_cpus_of_one_model_name_apart(probe, monkeypatch, tmp_path, change):
    """One model name ("Intel(R) Xeon(R) Processor") covers CPUs with AMX and without, whose
    answers differ in sign: the flags, the cores and torch's build are in the key."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Intel(R) Xeon(R) Processor\n" + AMX)
    opened = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened(
        cpuinfo if path == "/proc/cpuinfo" else path, *a, **k))
    first = cpu_probe.machine_key()
    assert "amx_bf16" in first and "Intel(R) Xeon(R) Processor" in first
    auto()
    if change == "flags":
        cpuinfo.write_text("model name\t: Intel(R) Xeon(R) Processor\n" + NO_AMX)
    elif change == "torch":
        monkeypatch.setattr(torch, "__version__", "9.9.9")
    else:
        monkeypatch.setattr(hardware, "usable_cpus", lambda: 64)
    assert cpu_probe.machine_key() != first
    probe.rates = EPYC
    assert auto().name == "bf16" and len(probe.steps) == 2
    assert len(json.loads(probe.path.read_text())) == 2


def test_a_figure_taken_on_a_busy_machine_is_taken_again(probe, monkeypatch):
    monkeypatch.setattr(cpu_probe, "_load", lambda: hardware.usable_cpus() + 2.0)
    auto()  # busier than its cores: used now, kept with its load
    monkeypatch.setattr(cpu_probe, "_load", lambda: 0.1)
    probe.rates = EPYC
    assert auto().name == "bf16" and len(probe.steps) == 2  # measured again, quiet
    assert auto().name == "bf16" and len(probe.steps) == 2  # and now trusted


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"KEY": "fast"}',
                                  '{"KEY": {"fp32": -1, "bf16": 5, "load": 0, "cores": 2}}',
                                  '{"KEY": {"fp32": 1, "bf16": 5}}',
                                  '{"KEY": {"fp32": 1%s, "bf16": 5, "load": 0, "cores": 2}}'
                                  % ("0" * 400),
                                  '{"KEY": {"fp32": true, "bf16": 5, "load": 0, "cores": 2}}',
                                  "[" * 100_000, "\udcff\udcfe{}"])
def test_a_malformed_cache_is_measured_again_without_a_traceback(probe, text, recwarn):
    """Not JSON, not an object, an entry of other figures, a number too large for a float, a
    nesting deeper than Python's recursion, bytes that are not UTF-8: one warning line, measured
    again, the file rewritten whole."""
    probe.path.parent.mkdir(parents=True)
    key = cpu_probe.cache_key(recipe_step())
    probe.path.write_bytes(text.replace("KEY", key).encode("utf-8", "surrogateescape"))
    assert auto().name == "fp32" and len(probe.steps) == 1
    why = ("its entry for this machine is not figures of rul's" if "KEY" in text else
           "not a JSON object of figures")
    assert [str(w.message) for w in recwarn] == [f"rul's cache: {probe.path}: {why}; "
                                                 "measured again"]
    assert json.loads(probe.path.read_text())[key]["fp32"] == XEON["fp32"]  # rewritten whole


@pytest.mark.parametrize("asked", ["fp32", "bf16"])
def test_a_precision_asked_for_wins_and_nothing_is_measured(probe, asked):
    precision = resolve_precision(asked, CPU, "cnn", probe=cpu_measured)
    assert (precision.name, precision.reason) == (asked, "asked for")
    assert probe.steps == []


def test_no_measurement_without_native_bf16_or_for_other_models(probe, monkeypatch):
    assert auto("lstm").name == "fp32"
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    assert auto().name == "fp32"
    assert probe.steps == []


def test_the_probe_times_both_precisions_and_leaves_the_random_state_alone():
    """The real timed step, as short as it goes (one round of one step of 16 samples)."""
    before = torch.get_rng_state()
    step = dataclasses.replace(recipe_step(), effective_batch_size=16, micro_batch_size=8)
    rates = cpu_probe.measure_step(step, rounds=1, seconds=0.0, budget=0.0)
    assert set(rates) == {"fp32", "bf16"} and all(rate > 0 for rate in rates.values())
    assert torch.equal(torch.get_rng_state(), before)

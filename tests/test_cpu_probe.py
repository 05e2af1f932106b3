"""`precision: auto` on a CPU with native bf16 picks what this machine measured faster for the
default step (rul.training.cpu_probe), not what its flags suggest: once per machine, kept in a
user cache under the CPU's model and torch's version, its figures in the reason; a precision
asked for is taken without measuring. The suite's other tests read fixed figures (conftest)."""

import json

import pytest
import torch

from rul.training import cpu_probe, hardware
from rul.training.precision import resolve_precision

CPU = torch.device("cpu")
XEON = {"fp32": 9301.0, "bf16": 6656.0}  # issue 51's 2-core Xeon, AVX512-BF16 without AMX
EPYC = {"fp32": 11000.0, "bf16": 16229.0}


@pytest.fixture
def probe(monkeypatch, tmp_path):
    """A CPU with native bf16, an empty cache and a stand-in for the timed step whose figures
    the test sets; `probe.calls` counts the measurements."""
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("RUL_PRECISION_CACHE", str(tmp_path / "cache" / "precision.json"))
    state = type("Probe", (), {"calls": 0, "rates": XEON, "path": tmp_path / "cache"
                               / "precision.json"})()

    def measure():
        state.calls += 1
        return dict(state.rates)

    monkeypatch.setattr(cpu_probe, "measure_step", measure)
    return state


def test_auto_picks_the_precision_measured_faster_and_quotes_the_figures(probe):
    precision = resolve_precision("auto", CPU, "cnn")
    assert precision.name == "fp32"  # the flag says bf16; this machine's step says fp32
    assert "measured now): fp32 9,301 samples/s, bf16 6,656; fp32 is the faster" in \
        precision.reason
    assert cpu_probe.machine_key() in precision.reason
    kept = json.loads(probe.path.read_text())
    assert kept[cpu_probe.machine_key()]["fp32"] == 9301.0 and probe.calls == 1

    again = resolve_precision("auto", CPU, "cnn")  # the next run: read, not measured
    assert again.name == "fp32" and probe.calls == 1
    assert f"measured before, kept in {probe.path}" in again.reason


def test_where_bf16_is_faster_auto_picks_it(probe):
    probe.rates = EPYC
    precision = resolve_precision("auto", CPU, "cnn")
    assert precision.name == "bf16"
    assert "bf16 16,229 samples/s, fp32 11,000; bf16 is the faster at the same 5-seed " \
           "accuracy" in precision.reason


def test_the_cache_is_per_cpu_model_and_torch_version(probe, monkeypatch):
    resolve_precision("auto", CPU, "cnn")
    monkeypatch.setattr(torch, "__version__", "9.9.9")  # a newer torch measures again
    probe.rates = EPYC
    assert resolve_precision("auto", CPU, "cnn").name == "bf16" and probe.calls == 2
    assert len(json.loads(probe.path.read_text())) == 2


@pytest.mark.parametrize("asked", ["fp32", "bf16"])
def test_a_precision_asked_for_wins_and_nothing_is_measured(probe, asked):
    precision = resolve_precision(asked, CPU, "cnn")
    assert (precision.name, precision.reason) == (asked, "asked for")
    assert probe.calls == 0


def test_no_measurement_without_native_bf16_or_for_other_models(probe, monkeypatch):
    assert resolve_precision("auto", CPU, "lstm").name == "fp32"
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", CPU, "cnn").name == "fp32"
    assert probe.calls == 0


def test_the_probe_times_both_precisions_and_leaves_the_random_state_alone():
    """The real timed step, as short as it goes (one round of one step of 16 samples each)."""
    before = torch.get_rng_state()
    rates = cpu_probe.measure_step(rounds=1, seconds=0.0, budget=0.0, batch=16)
    assert set(rates) == {"fp32", "bf16"} and all(rate > 0 for rate in rates.values())
    assert torch.equal(torch.get_rng_state(), before)

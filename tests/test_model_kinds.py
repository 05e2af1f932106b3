"""Every network kind of rul.models.spec.NETWORK_KINDS, checked alike: its row builds its
backbone, windows map to one RUL each, eval clamps to [0, rul_cap], the ONNX export computes
what torch computes, stored weights load into a fresh build, and its architecture keys keep the
identity of runs tracked before. A new row is checked here without editing this file."""

import inspect

import numpy as np
import pytest
import torch
from torch import nn

from rul import config as cfg
from rul.models.spec import ARCHITECTURE_FALLBACKS, KINDS, NETWORK_KINDS, NetworkSpec
from rul.plan import network_of
from rul.serving.onnx_export import MAX_DIFFERENCE, export_onnx
from rul.serving.runtime import onnxruntime
from rul.serving.spec import InferenceSpec
from rul.serving.torch_weights import load_networks
from rul.tracking.run_names import config_digest

# Small enough for a few seconds over all kinds; each differs from its default, so that a
# fresh build that missed an argument would not fit the stored weights. An even kernel, as the
# default's: the DCNN's layers trim a step (exported too).
TINY = {"filters": 4, "kernel_size": 4, "num_layers": 2, "hidden_size": 16, "num_heads": 2,
        "dropout": 0.1}
# The architecture keys of TrainConfig when run identities were first recorded (they are in
# every tracked run's digest). A key added since must stay out of the identity at its default.
# The recipe's head width (50) is not a multiple of the transformer's default 4 heads.
WIDTH_FOR_HEADS = {"transformer": {"hidden_size": 64}}
RECORDED_ARCHITECTURE_KEYS = frozenset({"filters", "kernel_size", "num_layers", "hidden_size",
                                        "dropout", "num_heads"})


def tiny_spec(kind: str, n_features: int = 14, window: int = 30) -> NetworkSpec:
    return NetworkSpec(kind, n_features, window, 125, TINY)


def tiny_network(kind: str, seed: int = 0, **shape) -> nn.Module:
    torch.manual_seed(seed)
    return tiny_spec(kind, **shape).build()


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_names_a_backbone_and_every_argument_it_takes_in_order(kind):
    """The constructor takes the row's inputs, then its fixed and architecture arguments in the
    row's order, and nothing else: a config key the row forgot would silently be ignored."""
    row = NETWORK_KINDS[kind]
    backbone = row.backbone_class()
    assert issubclass(backbone, nn.Module)
    assert set(row.inputs) <= {"n_features", "window", "shape"}
    assert set(row.args) <= set(ARCHITECTURE_FALLBACKS)
    parameters = list(inspect.signature(backbone).parameters)
    assert set(row.fixed) <= set(parameters)
    assert [p for p in parameters if p not in row.fixed] == [*row.inputs, *row.args]


@pytest.mark.parametrize("kind", KINDS)
def test_a_config_of_the_kind_maps_windows_to_rul_without_batchnorm(kind):
    """BatchNorm would make accumulated micro-batches differ from one large batch."""
    config = cfg.load(None, {"model": kind, **TINY, "window": 12})
    network = network_of(config, 5).build()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in network.modules())
    for mode in (network.train, network.eval):
        assert mode()(torch.randn(3, 12, 5)).shape == (3,)


@pytest.mark.parametrize("kind", KINDS)
def test_eval_predictions_are_clamped_to_the_target_range_training_outputs_are_not(kind):
    network = tiny_network(kind, window=12, n_features=5)
    raw = torch.tensor([5.0, -5.0, 0.5, 0.25])  # backbone outputs, in units of rul_cap
    # the backbone's own output, moved to `raw` (its gradient kept)
    network.backbone.register_forward_hook(lambda module, args, out: out - out.detach() + raw)
    x = torch.randn(4, 12, 5)
    trained = network.train()(x)
    assert torch.equal(trained, torch.tensor([625.0, -625.0, 62.5, 31.25]))
    trained.sum().backward()  # training keeps the gradient outside the range
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in network.parameters())
    assert torch.equal(network.eval()(x), torch.tensor([125.0, 0.0, 62.5, 31.25]))


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_exports_to_onnx_with_any_batch(kind, tmp_path):
    network = tiny_network(kind).eval()
    difference = export_onnx(network, tmp_path / "net.onnx", 30, 14)
    assert difference <= MAX_DIFFERENCE == 1e-3
    session = onnxruntime().InferenceSession(str(tmp_path / "net.onnx"))
    for batch in (1, 3, 100):
        x = np.random.default_rng(batch).normal(0, 1, (batch, 30, 14)).astype(np.float32)
        with torch.inference_mode():
            expected = network(torch.from_numpy(x)).numpy()
        got = session.run(["rul"], {"windows": x})[0]
        assert got.shape == (batch,)
        np.testing.assert_allclose(got, expected, atol=1e-3, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_stored_weights_load_into_a_fresh_build_and_predict_the_same(kind, tmp_path):
    """Through the stored inference spec (JSON) and state dict, as a run's weights are read."""
    network = tiny_network(kind, seed=0).eval()
    InferenceSpec.from_network(tiny_spec(kind)).write(tmp_path / "spec.json")
    torch.save(network.state_dict(), tmp_path / "model.pt")
    spec = InferenceSpec.read(tmp_path / "spec.json")
    (loaded,) = load_networks(spec, tmp_path / "model.pt")
    x = torch.randn(8, 30, 14)
    with torch.no_grad():
        assert not torch.equal(tiny_network(kind, seed=1).eval()(x), network(x))  # seeds differ
        assert torch.equal(loaded(x), network(x))


def test_architecture_keys_are_config_keys_and_a_spec_without_one_builds_what_runs_had():
    """Each architecture key is a config key; a stored spec lacks only a key added since specs
    were first stored, and builds the value every run had before it (LEGACY_VALUES)."""
    assert set(ARCHITECTURE_FALLBACKS) <= set(cfg.TrainConfig.model_fields)
    for key in set(ARCHITECTURE_FALLBACKS) - RECORDED_ARCHITECTURE_KEYS:
        assert ARCHITECTURE_FALLBACKS[key] == cfg.LEGACY_VALUES[key]


@pytest.mark.parametrize("kind", KINDS)
def test_a_kinds_keys_keep_the_identity_of_runs_tracked_before(kind):
    """At its default, an architecture key added since identities were first recorded is not
    written (LEGACY_VALUES), so runs tracked before keep their digest; set otherwise, every
    key of the kind is part of the identity (it changes the network)."""
    config = cfg.load(None, {"model": kind, **WIDTH_FOR_HEADS.get(kind, {})})
    row = NETWORK_KINDS[kind]
    added = set(row.args) - RECORDED_ARCHITECTURE_KEYS
    assert added <= set(cfg.LEGACY_VALUES)
    written = set(config.identity()) & set(ARCHITECTURE_FALLBACKS)
    assert written == RECORDED_ARCHITECTURE_KEYS
    for key in row.args:  # a valid config with this key at another value
        changed = cfg.load(None, {"model": kind, **WIDTH_FOR_HEADS.get(kind, {}),
                                  key: TINY[key]})
        assert changed.identity()[key] == TINY[key] != config.model_dump()[key]
        assert config_digest(changed) != config_digest(config)

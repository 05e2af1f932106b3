"""tools/: the truncation score that compares models with different windows fairly."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rul.data.split import rows_of
from rul.evaluation.metrics import rmse
from rul.models import build_network
from rul.preprocessing import Preprocessor
from rul.training.batching import WindowBatches
from rul.training.predict import predict_windows

TOOL = Path(__file__).resolve().parents[1] / "tools" / "truncation_val.py"
ARCH = {"filters": 4, "kernel_size": 10, "num_layers": 2, "hidden_size": 16, "dropout": 0.5}


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("truncation_val", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_model(fd001, window):
    """An untrained, seeded network with its fitted preprocessing (the pyfunc's inner model)."""
    preprocessor = Preprocessor(window=window, smoothing_alpha=0.1,
                                include_cycle=True).fit(fd001.train)
    torch.manual_seed(0)
    network = build_network("cnn", preprocessor.n_features, window, 125, **ARCH).eval()
    return SimpleNamespace(preprocessor=preprocessor, model=network)


def test_from_the_window_on_it_is_the_val_rmse_of_every_full_window(tool, fd001):
    rows = rows_of(fd001.train, np.array([3, 17, 58]))
    inner = tiny_model(fd001, 30)
    windows = inner.preprocessor.window_set(rows)
    expected = rmse(predict_windows(inner.model, WindowBatches(windows, torch.device("cpu"))),
                    windows.targets)
    score, n = tool.truncation_rmse(inner, rows, first_cycle=30)
    assert n == len(windows) == sum(len(g) - 29 for _, g in rows.groupby("unit"))
    assert score == pytest.approx(expected, rel=1e-5)


def test_a_longer_window_is_scored_on_the_same_truncations_edge_padded(tool, fd001):
    rows = rows_of(fd001.train, np.array([3, 17, 58]))
    inner = tiny_model(fd001, 40)
    score, n = tool.truncation_rmse(inner, rows, first_cycle=30)
    assert n == sum(len(g) - 29 for _, g in rows.groupby("unit"))  # the window-30 count
    # cycles 30-39 are predicted from padded histories, the rest from full windows
    full, n_full = tool.truncation_rmse(inner, rows, first_cycle=40)
    assert n_full == n - 3 * 10 and full != score


def test_a_lean_model_scores_as_its_torch_network(tool, fd001, tmp_path):
    """Models logged now run ONNX: the same score as the torch network within float noise."""
    from rul.models.spec import NetworkSpec
    from rul.serving.onnx_export import save_runtime
    from rul.serving.runtime import LeanModel

    rows = rows_of(fd001.train, np.array([3, 17]))
    inner = tiny_model(fd001, 30)
    spec = NetworkSpec("cnn", inner.preprocessor.n_features, 30, 125, ARCH)
    save_runtime(tmp_path, spec, [inner.model], inner.preprocessor)
    lean = SimpleNamespace(model=LeanModel.load(tmp_path))  # the lean pyfunc's inner model
    assert tool.truncation_rmse(lean, rows, 30) == pytest.approx(
        tool.truncation_rmse(inner, rows, 30), rel=1e-5)

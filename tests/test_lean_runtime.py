"""The lean runtime pinned to training's: the preprocessing numbers, the ONNX networks, the
envelope's flags. No MLflow here (test_inference.py and test_serving.py serve the model)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.preprocessing import MinMaxScaler, StandardScaler

from rul.data.schema import SETTING_COLUMNS
from rul.evaluation.conformal import Interval
from rul.files import USER_CACHE_ENV
from rul.models.spec import NetworkSpec
from rul.preprocessing import Preprocessor
from rul.preprocessing.envelope import Envelope
from rul.preprocessing.fitted import FittedPreprocessing
from rul.serving.onnx_export import ExportError, check_export, export_onnx, save_runtime
from rul.serving.predictor import predict_frame
from rul.serving.runtime import TELEMETRY_ENV, LeanModel, onnxruntime

ROOT = Path(__file__).resolve().parents[1]
TINY = {"filters": 4, "num_layers": 2, "hidden_size": 16, "num_heads": 2}


def stored(preprocessor: Preprocessor) -> FittedPreprocessing:
    """The numbers as a logged model keeps them: through JSON and back."""
    return FittedPreprocessing.from_dict(json.loads(json.dumps(preprocessor.fitted().to_dict())))


def tiny_network(kind: str, n_features: int, window: int = 30, seed: int = 0):
    torch.manual_seed(seed)
    return NetworkSpec(kind, n_features, window, 125, TINY)


# ------------------------------------------------------------------ the preprocessing numbers


@pytest.mark.parametrize("options", [{}, {"normalization": "zscore", "include_cycle": True,
                                          "smoothing_alpha": 0.3},
                                     {"include_settings": True, "drop_constant": True}])
def test_stored_numbers_transform_fd001_exactly_like_the_preprocessor(fd001, options):
    preprocessor = Preprocessor(**options).fit(fd001.train)
    np.testing.assert_array_equal(stored(preprocessor).transform(fd001.test),
                                  preprocessor.transform(fd001.test))


def test_the_numbers_are_scikit_learns_scaler_on_fd001(fd001):
    """An independent reference: MinMaxScaler fitted on the same training rows."""
    preprocessor = Preprocessor(smoothing_alpha=1.0).fit(fd001.train)
    columns = preprocessor.feature_columns_
    reference = MinMaxScaler(feature_range=(-1, 1)).fit(fd001.train[columns])
    np.testing.assert_array_equal(stored(preprocessor).transform(fd001.test),
                                  reference.transform(fd001.test[columns]).astype(np.float32))


@pytest.fixture(scope="module")
def six_conditions():
    from conftest import synthetic_frame

    return (synthetic_frame([60, 70, 55, 80], seed=3, conditions=6),
            synthetic_frame([40, 50, 45], seed=4, first_unit=9, conditions=6))


def test_stored_numbers_find_the_conditions_kmeans_finds(six_conditions):
    """FD002-like rows: the stored centres give each row KMeans' own condition, and each
    condition is scaled as scikit-learn's scaler fitted on that condition's rows."""
    train, test = six_conditions
    preprocessor = Preprocessor(n_conditions=6, normalization="zscore", smoothing_alpha=1.0,
                                include_cycle=True).fit(train)
    numbers = stored(preprocessor)
    kmeans = preprocessor.scaler_.kmeans_
    for rows in (train, test):
        settings = rows[SETTING_COLUMNS].to_numpy()
        np.testing.assert_array_equal(numbers.conditions(settings), kmeans.predict(settings))
        np.testing.assert_array_equal(numbers.transform(rows), preprocessor.transform(rows))
    labels = kmeans.predict(train[SETTING_COLUMNS].to_numpy())
    test_labels = kmeans.predict(test[SETTING_COLUMNS].to_numpy())
    measured = numbers.measured
    expected = np.empty((len(test), len(measured)))
    for k in range(6):
        scaler = StandardScaler().fit(train.loc[labels == k, measured])
        expected[test_labels == k] = scaler.transform(test.loc[test_labels == k, measured])
    np.testing.assert_allclose(numbers.transform(test)[:, :-1], expected, atol=1e-5)
    age = StandardScaler().fit(train[["cycle"]]).transform(test[["cycle"]])  # one scaler
    np.testing.assert_allclose(numbers.transform(test)[:, -1:], age, atol=1e-5)
    smoothed = Preprocessor(n_conditions=6, smoothing_alpha=0.2).fit(train)
    np.testing.assert_array_equal(stored(smoothed).transform(test), smoothed.transform(test))


def test_stored_numbers_that_do_not_fit_are_refused(fd001):
    values = Preprocessor().fit(fd001.train).fitted().to_dict()
    with pytest.raises(ValueError, match=r"lacks \['scale'\]"):
        FittedPreprocessing.from_dict({k: v for k, v in values.items() if k != "scale"})
    with pytest.raises(ValueError, match="do not fit 13 measured features"):
        FittedPreprocessing.from_dict({**values, "feature_columns": values["feature_columns"][1:]})


# ------------------------------------------------------------------ the ONNX networks


def test_an_onnx_file_of_other_weights_is_refused(tmp_path):
    export_onnx(tiny_network("cnn", 14, seed=0).build().eval(), tmp_path / "a.onnx", 30, 14)
    other = tiny_network("cnn", 14, seed=1).build().eval()
    with pytest.raises(ExportError, match="differs from torch by"):
        check_export(other, tmp_path / "a.onnx", 30, 14)


def _exported(path, windows: np.ndarray) -> np.ndarray:
    session = onnxruntime().InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"windows": windows})[0]


def test_an_architecture_is_traced_once_and_each_network_exports_its_own_weights(
        tmp_path, monkeypatch):
    """The second network of an architecture (an ensemble's next member) is exported from the
    kept graph with its own weights, as a fresh trace would write it; another architecture
    (heads here: the same weight shapes) is traced anew."""
    from rul.serving import onnx_export

    traced = []
    real = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: traced.append(1) or real(*a, **k))
    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
    monkeypatch.setenv(USER_CACHE_ENV, str(tmp_path / "cache"))  # nothing traced before
    first, second = (tiny_network("transformer", 14, seed=s).build().eval() for s in (0, 1))
    for name, network in (("first", first), ("second", second), ("again", first)):
        assert export_onnx(network, tmp_path / f"{name}.onnx", 30, 14) <= 1e-3
    assert len(traced) == 1
    assert (tmp_path / "first.onnx").read_bytes() == (tmp_path / "again.onnx").read_bytes()
    windows = np.random.default_rng(1).uniform(-1, 1, (8, 30, 14)).astype(np.float32)
    with torch.no_grad():
        expected = second(torch.from_numpy(windows)).numpy()
    np.testing.assert_allclose(_exported(tmp_path / "second.onnx", windows), expected, atol=1e-3)
    assert not np.allclose(_exported(tmp_path / "first.onnx", windows), expected, atol=1e-3)
    torch.manual_seed(1)
    other_heads = NetworkSpec("transformer", 14, 30, 125, {**TINY, "num_heads": 4}).build().eval()
    assert export_onnx(other_heads, tmp_path / "heads.onnx", 30, 14) <= 1e-3
    assert len(traced) == 2


def _this_process_only(tmp_path, monkeypatch) -> None:
    """No user cache (its folder cannot be made): a graph this process kept that fails is
    traced again, with no good copy on disk to fall back on."""
    blocked = tmp_path / "not a folder"
    blocked.write_text("")
    monkeypatch.setenv(USER_CACHE_ENV, str(blocked))


def test_a_kept_graph_that_computes_something_else_is_traced_again(tmp_path, monkeypatch):
    from rul.serving import onnx_export

    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
    _this_process_only(tmp_path, monkeypatch)
    network = tiny_network("transformer", 14).build().eval()
    export_onnx(network, tmp_path / "a.onnx", 30, 14)
    (key,) = onnx_export._GRAPHS
    torch.manual_seed(1)  # 4 heads instead of 2: the same weights, another computation
    other = NetworkSpec("transformer", 14, 30, 125, {**TINY, "num_heads": 4}).build().eval()
    export_onnx(other, tmp_path / "b.onnx", 30, 14)
    onnx_export._GRAPHS[key] = onnx_export._GRAPHS.pop(next(k for k in onnx_export._GRAPHS
                                                             if k != key))  # a wrong graph
    assert export_onnx(network, tmp_path / "c.onnx", 30, 14) <= 1e-3
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "c.onnx").read_bytes()
    window_20 = tiny_network("cnn", 14, window=20).build().eval()  # other weights' shapes
    onnx_export._GRAPHS[onnx_export._architecture(window_20, 20, 14)] = onnx_export._GRAPHS[key]
    assert export_onnx(window_20, tmp_path / "d.onnx", 20, 14) <= 1e-3


def test_a_graph_traced_by_one_process_exports_in_the_next_without_a_trace(
        tmp_path, monkeypatch):
    """The user's cache keeps the graph across processes (this one's kept graphs emptied in
    between): the next export writes the very file a fresh trace writes, untraced."""
    from rul.serving import onnx_export

    traced = []
    real = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: traced.append(1) or real(*a, **k))
    monkeypatch.setenv(USER_CACHE_ENV, str(tmp_path / "cache"))
    network = tiny_network("cnn", 14).build().eval()
    for name in ("first", "next"):
        monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())  # a new process
        assert export_onnx(network, tmp_path / f"{name}.onnx", 30, 14) <= 1e-3
    assert len(traced) == 1
    assert (tmp_path / "first.onnx").read_bytes() == (tmp_path / "next.onnx").read_bytes()
    (kept,) = (tmp_path / "cache" / onnx_export.GRAPH_CACHE).iterdir()
    assert kept.suffix == ".onnx"


def test_a_damaged_cache_file_is_traced_again_and_replaced(tmp_path, monkeypatch):
    from rul.serving import onnx_export

    monkeypatch.setenv(USER_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
    network = tiny_network("cnn", 14).build().eval()
    export_onnx(network, tmp_path / "a.onnx", 30, 14)
    (kept,) = (tmp_path / "cache" / onnx_export.GRAPH_CACHE).iterdir()
    good = kept.read_bytes()
    for damage in (good[: len(good) // 2], b"not an ONNX graph"):
        kept.write_bytes(damage)
        monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
        assert export_onnx(network, tmp_path / "b.onnx", 30, 14) <= 1e-3
        assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
        assert kept.read_bytes() == good
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # no scratch file left


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    from rul.serving import onnx_export

    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv(USER_CACHE_ENV, str(blocked))
    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
    assert export_onnx(tiny_network("cnn", 14).build().eval(), tmp_path / "a.onnx", 30, 14) <= 1e-3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file, not a folder", "a.onnx"]


def test_a_cache_write_interrupted_leaves_no_scratch_file(tmp_path, monkeypatch):
    from rul.files import CacheFile

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        CacheFile(tmp_path / "cache", "graph.onnx").keep(b"graph")
    assert list((tmp_path / "cache").iterdir()) == []


def halved_when_smooth(graph: bytes) -> bytes:
    """`graph` (a traced network) made to halve its answer whenever the window is smooth: the
    mean step between a window's cycles under 0.5, as in every real window (the preprocessing
    smooths the sensors) and in no window of uniform noise."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.ModelProto.FromString(graph)
    nodes = model.graph.node
    for node in nodes:
        node.output[:] = ["raw" if name == "rul" else name for name in node.output]

    def constant(name, values, kind=TensorProto.INT64):
        return helper.make_node("Constant", [], [name], name=name, value=helper.make_tensor(
            name, kind, [len(values)], values))

    nodes.extend([
        constant("one", [1]), constant("zero", [0]), constant("last", [-1]),
        constant("end", [2**62]), constant("cycles", [1, 2]),
        constant("half", [0.5], TensorProto.FLOAT),
        helper.make_node("Slice", ["windows", "one", "end", "one"], ["later"], name="later"),
        helper.make_node("Slice", ["windows", "zero", "last", "one"], ["earlier"],
                         name="earlier"),
        helper.make_node("Sub", ["later", "earlier"], ["step"], name="step"),
        helper.make_node("Abs", ["step"], ["size"], name="size"),
        helper.make_node("ReduceMean", ["size", "cycles"], ["rough"], keepdims=0, name="rough"),
        helper.make_node("Less", ["rough", "half"], ["smooth"], name="smooth"),
        helper.make_node("Mul", ["raw", "half"], ["halved"], name="halved"),
        helper.make_node("Where", ["smooth", "halved", "raw"], ["rul"], name="forged"),
    ])
    return model.SerializeToString()


def test_a_kept_graph_that_halves_its_answer_on_smooth_windows_is_caught_and_traced_again(
        fd001, fd001_preprocessor, tmp_path, monkeypatch, recwarn):
    """A graph planted in the user cache that keeps the network but halves its answer on
    smooth windows passes a check on noise alone; the check on the run's real windows catches
    it: the export is a fresh trace's, the cache file replaced, one warning line."""
    from rul.serving import onnx_export

    monkeypatch.setenv(USER_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
    n_features = fd001_preprocessor.n_features
    network = tiny_network("cnn", n_features).build().eval()
    kept = onnx_export._cache_file(onnx_export._architecture(network, 30, n_features))
    kept.keep(halved_when_smooth(onnx_export._trace(network, 30, n_features)))
    real = fd001_preprocessor.window_set(fd001.train).spread(256)
    with torch.no_grad():
        expected = network(torch.from_numpy(real)).numpy()

    onnx_export._write(network, kept.read(), tmp_path / "forged.onnx")
    assert check_export(network, tmp_path / "forged.onnx", 30, n_features) <= 1e-3  # noise
    np.testing.assert_allclose(_exported(tmp_path / "forged.onnx", real), expected / 2,
                               atol=1e-3)  # every real window halved
    with pytest.raises(ExportError, match="cycles on real windows"):
        check_export(network, tmp_path / "forged.onnx", 30, n_features, real)

    assert export_onnx(network, tmp_path / "a.onnx", 30, n_features, real) <= 1e-3
    np.testing.assert_allclose(_exported(tmp_path / "a.onnx", real), expected, atol=1e-3)
    assert [str(w.message) for w in recwarn] == [
        f"rul's cache: {kept.path}: does not compute what the network computes; not trusted, "
        "built anew"]
    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())  # a new process
    assert export_onnx(network, tmp_path / "b.onnx", 30, n_features, real) <= 1e-3
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert len(recwarn) == 1  # the kept graph is now the network's own


class _Scaled(torch.nn.Module):
    """A network holding a constant that is neither a parameter nor a buffer."""

    def __init__(self):
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(14, 1), torch.tensor(2.0)

    def forward(self, x):
        return self.linear(x[:, -1]).squeeze(-1) * self.scale


def test_a_network_with_constants_of_its_own_exports_and_a_broken_kept_graph_is_traced_again(
        tmp_path, monkeypatch):
    from rul.serving import onnx_export

    monkeypatch.setattr(onnx_export, "_GRAPHS", onnx_export.OrderedDict())
    _this_process_only(tmp_path, monkeypatch)
    for name in ("a", "b"):  # the second from the kept graph, its own weights
        assert export_onnx(_Scaled().eval(), tmp_path / f"{name}.onnx", 30, 14) <= 1e-3
    (key,) = onnx_export._GRAPHS
    onnx_export._GRAPHS[key] = b"not an ONNX graph"
    assert export_onnx(_Scaled().eval(), tmp_path / "c.onnx", 30, 14) <= 1e-3
    assert onnx_export._GRAPHS[key] != b"not an ONNX graph"


@pytest.fixture(scope="module")
def fd001_preprocessor(fd001):
    return Preprocessor(window=30, smoothing_alpha=0.1).fit(fd001.train)


def test_lean_ensemble_predicts_what_torch_predicts(fd001, fd001_preprocessor,
                                                     tmp_path_factory):
    """Two members, an interval: the runtime folder alone (no MLflow, no torch at predict
    time) gives torch's mean, spread and bounds within 1e-3 cycles, flags included."""
    spec = tiny_network("cnn", fd001_preprocessor.n_features)
    networks = [tiny_network("cnn", spec.n_features, seed=s).build().eval() for s in (0, 1)]
    interval = Interval(0.9, 20.0, 100)
    folder = tmp_path_factory.mktemp("ensemble")
    save_runtime(folder, spec, networks, fd001_preprocessor, interval)
    lean = LeanModel.load(folder).predict(fd001.test)
    by_torch = predict_frame(fd001_preprocessor, networks, fd001.test, interval=interval,
                             envelope=fd001_preprocessor.envelope_)
    assert list(lean.columns) == list(by_torch.columns) == [
        "unit", "rul", "rul_lower", "rul_upper", "padded", "rul_std", "flagged", "flag_reason"]
    numbers = ["rul", "rul_lower", "rul_upper", "rul_std"]
    np.testing.assert_allclose(lean[numbers], by_torch[numbers], atol=1e-3, rtol=0)
    others = ["unit", "padded", "flagged", "flag_reason"]
    pd.testing.assert_frame_equal(lean[others], by_torch[others])
    assert (lean["rul_std"] > 0).mean() > 0.5


def test_rows_without_the_sensors_the_model_does_not_read_get_the_same_answer(
        fd001, fd001_preprocessor, tmp_path_factory):
    """FD001's model reads 14 sensors: rows without the other seven (constant in FD001) are
    answered as the whole rows are, in every format's path; given, they are still checked (a
    broken feed is flagged); a sensor it reads is still required."""
    from rul.serving.bodies import PARQUET
    from rul.serving.scoring import answer
    from rul.serving.served import Served

    spec = tiny_network("cnn", fd001_preprocessor.n_features)
    folder = tmp_path_factory.mktemp("unread")
    save_runtime(folder, spec, [spec.build().eval()], fd001_preprocessor, Interval(0.9, 20.0, 100))
    lean = LeanModel.load(folder)
    unread = list(fd001_preprocessor.envelope_.unread)
    assert lean.optional == tuple(unread) and len(unread) == 7 and "s_9" not in unread
    rows = fd001.test[fd001.test["unit"] <= 5]
    whole = lean.predict(rows)
    pd.testing.assert_frame_equal(lean.predict(rows.drop(columns=unread)), whole)
    served = Served(lean)
    body = rows.drop(columns=unread).to_parquet()
    result = answer(served, body, PARQUET)
    assert result.status == 200 and len(json.loads(result.payload)["predictions"]) == 5
    broken = rows.drop(columns=unread[1:]).assign(**{unread[0]: 1e9})
    assert lean.predict(broken)["flagged"].all()
    with pytest.raises(ValueError, match=r"missing columns \['s_9'\]; expected unit, cycle"):
        lean.predict(rows.drop(columns=[*unread, "s_9"]))


def test_onnxruntime_writes_nothing_and_reports_to_no_one(real_data_dir, tmp_path):
    """Exported, checked and loaded in a fresh process whose home and temporary folders are
    empty: onnxruntime's telemetry (on by default in its Linux wheels: a device id under
    ~/.cache/Microsoft, a session file in the temporary folder, events sent to Microsoft) is
    off, and nothing lands in either folder; a user who sets the variable decides."""
    home, temporary = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temporary.mkdir()
    script = f"""
import numpy as np
from rul.data import load_subset
from rul.preprocessing import Preprocessor
from rul.serving.onnx_export import save_runtime
from rul.serving.runtime import LeanModel
from test_lean_runtime import tiny_network
data = load_subset("FD001", {str(real_data_dir)!r})
preprocessor = Preprocessor(window=30).fit(data.train)
spec = tiny_network("cnn", preprocessor.n_features)
save_runtime({str(tmp_path / "model")!r}, spec, [spec.build().eval()], preprocessor, None)
print(len(LeanModel.load({str(tmp_path / "model")!r}).predict(data.test)))
"""
    env = {k: v for k, v in os.environ.items() if k != TELEMETRY_ENV}
    env.update(HOME=str(home), TMPDIR=str(temporary), XDG_CACHE_HOME=str(home / ".cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    env.pop(USER_CACHE_ENV, None)  # the cache of exported graphs goes to this home too
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-1] == "100", done.stderr[-3000:]
    written = [str(p.relative_to(tmp_path)) for p in (*home.rglob("*"), *temporary.rglob("*"))
               if p.is_file()]
    assert [w for w in written if not w.startswith("home/.cache/rul/")] == [], written


def test_a_served_prediction_past_its_deadline_stops(fd001, fd001_preprocessor,
                                                     tmp_path_factory):
    """rul's server sets each request's deadline (rul.serving.deadline); the prediction
    checks it between its steps and batches, and outside a request there is none."""
    import time

    from rul.serving import deadline

    spec = tiny_network("cnn", fd001_preprocessor.n_features)
    folder = tmp_path_factory.mktemp("deadline")
    save_runtime(folder, spec, [spec.build().eval()], fd001_preprocessor, None)
    model, rows = LeanModel.load(folder), fd001.test[fd001.test["unit"] <= 2]
    assert len(model.predict(rows)) == 2
    token = deadline.DEADLINE.set(time.monotonic() - 1)
    try:
        with pytest.raises(deadline.RequestTimedOut):
            model.predict(rows)
    finally:
        deadline.DEADLINE.reset(token)


def test_the_loader_says_what_a_folder_lacks(tmp_path):
    with pytest.raises(FileNotFoundError, match="no inference_spec.json here nor in "
                                                "artifacts/inference/"):
        LeanModel.load(tmp_path)


# ------------------------------------------------------------------ the envelope


@pytest.fixture(scope="module")
def envelope_check(fd001_preprocessor):
    """(flagged, reasons) of rows by the FD001 preprocessor's envelope, as a dict by unit."""
    def check(rows, preprocessor=fd001_preprocessor):
        labels = preprocessor.conditions(rows[SETTING_COLUMNS].to_numpy())
        flagged, reasons, _ = preprocessor.envelope_.check(
            rows, labels, preprocessor.window, whole_history=preprocessor.smoothing_alpha < 1)
        units = rows["unit"].drop_duplicates().tolist()
        assert [bool(r) for r in reasons] == flagged.tolist()
        return dict(zip(units, reasons))
    return check


def test_fd001_test_units_lie_inside_the_training_envelope(fd001, envelope_check):
    reasons = envelope_check(fd001.test)
    inside = sum(not r for r in reasons.values()) / len(reasons)
    assert inside >= 0.98, {u: r for u, r in reasons.items() if r}


def with_unit(rows, unit, edit):
    rows = rows.copy()
    mask = rows["unit"] == unit
    rows.loc[mask] = edit(rows.loc[mask].copy()).to_numpy()
    return rows


@pytest.mark.parametrize(("name", "edit", "reason"), [
    ("1e9 sensor", lambda u: u.assign(s_9=u["s_9"].where(u["cycle"] != 7, 1e9)),
     r"^s_9 [\d.e+]+ sd beyond the training range \(cycle 7\)$"),
    ("scaled sensors", lambda u: u.assign(**{c: u[c] * 1.05 for c in ("s_2", "s_3", "s_4")}),
     r"^s_\d+ [\d.e+]+ sd beyond the training range \(cycle \d+\)$"),
    ("shifted sensor", lambda u: u.assign(s_11=u["s_11"] + 3.0),
     r"^s_11 [\d.e+]+ sd beyond the training range \(cycle \d+\)$"),
    ("unfamiliar settings", lambda u: u.assign(setting_3=60.0),
     r"^settings unlike the training conditions \(cycle 1\)$"),
    ("late start", lambda u: u.assign(cycle=u["cycle"] + 40), r"^history starts at cycle 41$"),
    ("1e9 unread sensor", lambda u: u.assign(s_1=u["s_1"].where(u["cycle"] != 5, 1e9)),
     r"^s_1 \(not read\) [\d.e+]+ sd beyond the training range \(cycle 5\)$"),
])
def test_units_outside_the_fleet_are_flagged_with_a_reason(fd001, envelope_check, name, edit,
                                                          reason):
    rows = with_unit(fd001.test[fd001.test["unit"] <= 4], 3, edit)
    reasons = envelope_check(rows)
    assert [u for u, r in reasons.items() if r] == [3], (name, reasons)
    assert pd.Series([reasons[3]]).str.match(reason).all(), (name, reasons[3])


def test_an_unread_sensor_flags_a_broken_feed_not_noise_and_leaves_the_answer_alone(
        fd001, fd001_preprocessor):
    """s_1 is constant in FD001 and not read: 1e9 there flags the unit (strict refuses it)
    but is not `beyond` (interval and p_fail stay); noise of 0.01 % flags nothing."""
    envelope = fd001_preprocessor.envelope_
    assert "s_1" in envelope.unread and "s_1" not in envelope.columns
    rows = fd001.test[fd001.test["unit"] <= 3]
    broken = with_unit(rows, 2, lambda u: u.assign(s_1=1e9))
    noisy = rows.assign(s_1=rows["s_1"] * (1 + 1e-4 * np.sin(np.arange(len(rows)))))
    labels = np.zeros(len(rows), dtype=np.int64)
    flagged, reasons, beyond = envelope.check(broken, labels, 30, True)
    assert flagged.tolist() == [False, True, False] and not beyond.any(), reasons
    assert not envelope.check(noisy, labels, 30, True)[0].any()
    older = {k: v for k, v in envelope.to_dict().items() if not k.startswith("unread")}
    assert not Envelope.from_dict(older).check(broken, labels, 30, True)[0].any()


def test_gaps_and_short_histories_are_flagged(fd001, envelope_check):
    test = fd001.test
    longest = int(test.groupby("unit").size().idxmax())  # long enough without every other row
    gapped = test[(test["unit"] == longest) & (test["cycle"] % 2 == 1)]
    one_row = test[test["unit"] == 3].head(1)
    rows = pd.concat([test[test["unit"] == 1], gapped, one_row])
    reasons = envelope_check(rows)
    assert reasons[1] == ""
    n = len(test[test["unit"] == longest])
    assert reasons[longest] == f"{(n - 1) // 2} cycles missing"
    assert reasons[3] == "1-row history, shorter than the window (30)"


def test_only_the_rows_the_prediction_reads_count(fd001):
    """Without smoothing a prediction reads the last window only: a glitch before it is not
    the unit's problem; with smoothing every row carries into the last window."""
    unit = fd001.test[fd001.test["unit"] == 1]  # 31 rows
    glitch = unit.assign(s_9=unit["s_9"].where(unit["cycle"] != 1, 1e9))
    for alpha, flagged in ((1.0, False), (0.1, True)):
        preprocessor = Preprocessor(window=30, smoothing_alpha=alpha).fit(fd001.train)
        labels = np.zeros(len(glitch), dtype=np.int64)
        got, _, _ = preprocessor.envelope_.check(glitch, labels, 30, whole_history=alpha < 1)
        assert got.tolist() == [flagged], alpha


def test_each_condition_has_its_own_envelope(six_conditions):
    """FD002-like rows: a sensor value normal in one condition is far outside in another."""
    train, test = six_conditions
    preprocessor = Preprocessor(n_conditions=6, window=20, smoothing_alpha=1.0).fit(train)
    assert preprocessor.envelope_.low.shape == (6, preprocessor.n_features)
    settings = test[SETTING_COLUMNS].to_numpy()
    labels = preprocessor.conditions(settings)
    flagged, _, _ = preprocessor.envelope_.check(test, labels, 20, whole_history=False)
    assert not flagged.any()
    moved = test.copy()
    last = moved.index[moved["unit"] == 9][-1]
    other = (labels[moved.index.get_loc(last)] + 1) % 6  # another condition's settings
    centre = preprocessor.scaler_.centres[other]
    moved.loc[last, SETTING_COLUMNS] = centre
    flagged, reasons, _ = preprocessor.envelope_.check(
        moved, preprocessor.conditions(moved[SETTING_COLUMNS].to_numpy()), 20,
        whole_history=False)
    assert flagged.tolist() == [True, False, False]
    assert "sd beyond the training range" in reasons[0]


def test_the_envelope_survives_json(fd001_preprocessor, fd001, envelope_check):
    envelope = fd001_preprocessor.envelope_
    back = Envelope.from_dict(json.loads(json.dumps(envelope.to_dict())))
    rows = with_unit(fd001.test[fd001.test["unit"] <= 3], 2, lambda u: u.assign(s_4=1e9))
    rows = with_unit(rows, 3, lambda u: u.assign(s_19=-5.0))
    labels = np.zeros(len(rows), dtype=np.int64)
    assert back.check(rows, labels, 30, True)[1] == envelope.check(rows, labels, 30, True)[1]
    with pytest.raises(ValueError, match=r"envelope lacks \['spread'\]"):
        Envelope.from_dict({k: v for k, v in envelope.to_dict().items() if k != "spread"})

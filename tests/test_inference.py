"""Inference anywhere: one validation for every input format, the pyfunc model, `rul predict`.

Most tests use a model logged without training (a fitted Preprocessor and a seeded, untrained
tiny network: the numbers are arbitrary but deterministic), registered as rul-fd001@champion in
a temporary SQLite store. The logged model is the lean one (ONNX); models logged before it
(pickled Preprocessor, torch weights) are logged here the old way and must still load. The
clean-environment test (slow) is in test_lean_env.py.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rul.cli import main
from rul.data.errors import DataError
from rul.data.layout import Layout
from rul.data.reader import read_input
from rul.data.schema import COLUMNS
from rul.data.validation import NO_HEADER, validate_rows
from rul.evaluation.metrics import rul_metrics
from rul.models import NetworkSpec
from rul.preprocessing import Preprocessor
from rul.serving.onnx_export import ExportError
from rul.serving.predictor import InferenceSpec, predict_frame
from rul.tracking.model_logging import log_pyfunc

ROWS_OUT = ["unit", "rul", "padded", "flagged", "flag_reason"]  # the tiny model's output

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "rul-fd001"
CHAMPION_URI = f"models:/{MODEL_NAME}@champion"
ARCH = {"filters": 4, "kernel_size": 10, "num_layers": 2, "hidden_size": 16, "dropout": 0.5}
FORBIDDEN = ("tqdm", "click", "yaml", "matplotlib", "optuna")


def tiny_outcome(fd001, window=30, include_cycle=False, interval=None, scored_seed=0):
    """What log_pyfunc reads from a training outcome, without the training: the test units
    scored by torch (`scored_seed`: by the network of that seed, another model than the one
    logged unless 0)."""
    preprocessor = Preprocessor(window=window, smoothing_alpha=0.1,
                                include_cycle=include_cycle).fit(fd001.train)
    spec = NetworkSpec("cnn", preprocessor.n_features, window, 125, ARCH)
    networks = []
    for seed in sorted({0, scored_seed}):
        torch.manual_seed(seed)
        networks.append(spec.build().eval())
    scored = predict_frame(preprocessor, networks[-1], fd001.test)["rul"].to_numpy()
    predictions = pd.DataFrame({"unit": fd001.test["unit"].unique(), "true_rul": fd001.test_rul,
                                "predicted_rul": scored})
    metrics = {"test_rmse": rul_metrics(scored, fd001.test_rul, 125)["rmse"]}
    data = SimpleNamespace(preprocessor=preprocessor, subset=fd001,
                           val=preprocessor.window_set(fd001.train))
    return SimpleNamespace(network_spec=spec, models=networks[:1], model=networks[0],
                           interval=interval, data=data, predictions=predictions,
                           metrics=metrics)


def log_tiny_model(fd001, workdir: Path, register: bool = True, interval=None) -> str:
    """Log (and register as the champion) a tiny model to the current tracking store."""
    with mlflow.start_run():
        uri = log_pyfunc(tiny_outcome(fd001, interval=interval), workdir)
    if register:
        version = mlflow.register_model(uri, MODEL_NAME).version
        MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", version)
    return uri


def tiny_model_folder(fd001, root: Path, interval=None) -> str:
    """A tiny model logged to a store of its own in `root` and downloaded as a model folder
    (root/model), the working folder and the tracking URI as they were afterwards."""
    patch = pytest.MonkeyPatch()
    patch.chdir(root)
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlflow.db")
    try:
        uri = log_tiny_model(fd001, root / "work", register=False, interval=interval)
        return mlflow.artifacts.download_artifacts(uri, dst_path=str(root / "model"))
    finally:
        mlflow.set_tracking_uri(None)
        patch.undo()


@pytest.fixture(scope="module")
def store(tmp_path_factory, fd001):
    root = tmp_path_factory.mktemp("inference")
    patch = pytest.MonkeyPatch()
    patch.chdir(root)
    uri = f"sqlite:///{root}/mlflow.db"
    patch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    try:
        model_uri = log_tiny_model(fd001, root / "work")
        yield SimpleNamespace(root=root, uri=uri, model_uri=model_uri)
    finally:
        mlflow.set_tracking_uri(None)
        patch.undo()


@pytest.fixture(scope="module")
def model(store):
    return mlflow.pyfunc.load_model(CHAMPION_URI)


@pytest.fixture(scope="module")
def expected(model, fd001):
    """In-process predictions of the logged (lean) model on the typed FD001 test set."""
    return model.predict(fd001.test)


@pytest.fixture(scope="module")
def torch_outcome(fd001):
    """The logged model's torch network and Preprocessor (tiny_outcome is seeded)."""
    return tiny_outcome(fd001)


def raw_rows(real_data_dir) -> pd.DataFrame:
    """The test file read the obvious way: s_17 and s_18 come out as int64."""
    return pd.read_csv(Path(real_data_dir) / "test_FD001.txt", sep=r"\s+", header=None,
                       names=COLUMNS)


# ------------------------------------------------------------------ validate_rows


def test_validate_rows_types_integer_and_float_columns_alike(fd001, real_data_dir):
    raw = raw_rows(real_data_dir)
    assert raw["s_17"].dtype == np.int64 and raw["unit"].dtype == np.int64
    as_floats = raw.astype(np.float64)
    for frame in (raw, as_floats, raw.astype(str)):
        typed = validate_rows(frame)
        assert list(typed.columns) == COLUMNS
        pd.testing.assert_frame_equal(typed, fd001.test.reset_index(drop=True))


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("s_3", "abc", "row 6, column s_3: is not a number"),
        ("s_3", np.inf, "row 6, column s_3: is not finite"),
        ("setting_1", -np.inf, "row 6, column setting_1: is not finite"),
        ("s_21", np.nan, "row 6, column s_21: is missing"),
        ("cycle", 6.5, "row 6: cycle is not a positive whole number below 2**63"),
        ("unit", 0, "row 6: unit is not a positive whole number below 2**63"),
        ("unit", 2**63, "row 6: unit is not a positive whole number below 2**63"),
        ("unit", 2**70, "row 6: unit is not a positive whole number below 2**63"),
        ("unit", str(2**64 - 1), "row 6: unit is not a positive whole number below 2**63"),
        ("unit", -1, "row 6: unit is not a positive whole number below 2**63"),
        ("cycle", 5, "unit 1: duplicate cycle 5 (row 6)"),
        ("cycle", 100, "unit 1: cycles not strictly increasing (100 then 7 at row 7)"),
    ],
)
def test_validate_rows_names_row_and_column(fd001, column, value, problem):
    frame = fd001.test[fd001.test["unit"] <= 2].copy()
    frame[column] = frame[column].astype(object)
    frame.iloc[5, frame.columns.get_loc(column)] = value
    with pytest.raises(DataError) as info:
        validate_rows(frame, "payload.json")
    assert str(info.value) == f"payload.json: {problem}"


def test_validate_rows_missing_column_empty_frame_and_not_a_frame(fd001):
    with pytest.raises(DataError, match=r"^input: missing columns \['s_4', 's_9'\]"):
        validate_rows(fd001.test.drop(columns=["s_9", "s_4"]))
    with pytest.raises(DataError, match="^input: no rows$"):
        validate_rows(fd001.test.iloc[:0])
    with pytest.raises(DataError, match="expected a table of rows, got list"):
        validate_rows([[1, 2]])


def test_validate_rows_names_renamed_columns_briefly(fd001):
    renamed = fd001.test.rename(columns={"s_4": "s4", "s_9": "sensor 9"})
    with pytest.raises(DataError) as info:
        validate_rows(renamed)
    assert str(info.value) == ("input: missing columns ['s_4', 's_9'] (found instead ['s4', "
                               "'sensor 9']); expected unit, cycle, setting_1..setting_3, "
                               "s_1..s_21")
    with pytest.raises(DataError) as info:
        validate_rows(pd.DataFrame({f"{'x' * 100}{i}": [1.0] for i in range(40)}))
    assert str(info.value) == (f"input: missing all 26 columns (found instead "
                               f"{['x' * 12 + '...'] * 3} and 37 more); expected unit, cycle, "
                               "setting_1..setting_3, s_1..s_21")
    with pytest.raises(DataError, match=r"^input: missing 22 of the 26 columns; expected"):
        validate_rows(fd001.test[COLUMNS[:4]])


UNREAD = ("s_1", "s_5", "s_6", "s_10", "s_16", "s_18", "s_19")  # FD001's constant sensors


def test_a_missing_column_line_counts_and_lists_only_the_columns_a_model_reads(fd001):
    """With a served model's unread sensors optional, the line counts the 19 columns it reads
    and lists them (numbered runs as ranges), and says how many others may be left out; an
    unread sensor missing is no error."""
    rows = fd001.test[fd001.test["unit"] <= 2]
    reads = ("unit, cycle, setting_1..setting_3, s_2..s_4, s_7..s_9, s_11..s_15, s_17, s_20, "
             "s_21 (7 others optional)")
    with pytest.raises(DataError) as info:
        validate_rows(rows.drop(columns=["s_9", *UNREAD]), optional=UNREAD)
    assert str(info.value) == f"input: missing columns ['s_9']; expected {reads}"
    with pytest.raises(DataError) as info:
        validate_rows(rows[COLUMNS[:4]], optional=UNREAD)
    assert str(info.value) == f"input: missing 15 of the 19 columns; expected {reads}"
    with pytest.raises(DataError) as info:
        validate_rows(pd.DataFrame({"a": [1.0]}), optional=UNREAD)
    assert str(info.value) == (f"input: missing all 19 columns (found instead ['a']); "
                               f"expected {reads}")
    assert list(validate_rows(rows.drop(columns=list(UNREAD)), optional=UNREAD).columns) == [
        c for c in COLUMNS if c not in UNREAD]
    own = Layout(unit="engine", time="t", settings=("op1", "op2", "op3"),
                 sensors=tuple(f"T{i:02d}" for i in range(1, 16)))
    with pytest.raises(DataError) as info:
        validate_rows(pd.DataFrame({"engine": [1], "t": [1]}), layout=own,
                      optional=("T04", "T05"))
    assert str(info.value).endswith("expected engine, t, op1..op3, T01..T03, T06..T15 "
                                    "(2 others optional)")
    with pytest.raises(DataError, match=r"expected engine, t, op1\.\.op3, T01\.\.T14 \(1 other "
                                         r"optional\)$"):
        validate_rows(pd.DataFrame({"engine": [1], "t": [1]}), layout=own, optional=("T15",))


def test_validate_rows_ignores_extra_columns_and_keeps_unit_order(fd001):
    two = fd001.test[fd001.test["unit"].isin([1, 2])]
    swapped = pd.concat([two[two["unit"] == 2], two[two["unit"] == 1]]).assign(note="x")
    typed = validate_rows(swapped)
    assert list(typed.columns) == COLUMNS
    assert typed["unit"].iloc[0] == 2 and typed["unit"].iloc[-1] == 1


# ------------------------------------------------------------------ read_input: formats


def write_csv(frame, path, header=True):
    frame.to_csv(path, index=False, header=header)
    return path


def test_every_format_reads_to_the_same_typed_rows(tmp_path, fd001, real_data_dir):
    txt = Path(real_data_dir) / "test_FD001.txt"
    raw = raw_rows(real_data_dir)  # s_17, s_18 integers: written as "392", not "392.0"
    formats = {
        "txt": txt,
        "csv_header": write_csv(raw, tmp_path / "header.csv"),
        "csv_floats": write_csv(raw.astype(float), tmp_path / "floats.csv"),
        "csv_reordered": write_csv(raw[COLUMNS[::-1]], tmp_path / "reordered.csv"),
    }
    assert "392," in (tmp_path / "header.csv").read_text().splitlines()[1]
    for name, path in formats.items():
        pd.testing.assert_frame_equal(checked(path), fd001.test.reset_index(drop=True),
                                      obj=name)


def checked(path: Path) -> pd.DataFrame:
    """A file's rows as `rul predict` reads them and the model checks them (C-MAPSS's)."""
    return validate_rows(read_input(path), path)


def test_csv_errors_name_the_file_and_problem(tmp_path, fd001):
    rows = fd001.test[fd001.test["unit"] <= 2]
    header_only = tmp_path / "header_only.csv"
    header_only.write_text(",".join(COLUMNS) + "\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    repeated = rows.copy()
    repeated.iloc[3, 1] = repeated.iloc[2, 1]  # unit 1: cycle 3 twice
    bad_value = rows.astype({"s_2": object})
    bad_value.iloc[9, bad_value.columns.get_loc("s_2")] = "n/a"
    cases = {
        header_only: "header but no rows",
        empty: "file is empty",
        write_csv(rows.iloc[:, :20], tmp_path / "narrow.csv", header=False): NO_HEADER,
        write_csv(rows, tmp_path / "bare.csv", header=False): NO_HEADER,
        write_csv(rows.iloc[:, :4].set_axis(["engine", "time", "a", "b"], axis=1),
                  tmp_path / "named.csv"): "missing all 26 columns (found instead ['engine', "
                                           "'time', 'a'] and 1 more); expected unit, cycle",
        write_csv(rows.drop(columns="s_4"), tmp_path / "no_s4.csv"): "missing columns ['s_4']",
        write_csv(repeated, tmp_path / "repeated.csv"): "unit 1: duplicate cycle 3 (row 4)",
        write_csv(bad_value, tmp_path / "bad.csv"):
            "row 10, column s_2: is not a number",
        tmp_path / "absent.csv": "file not found",
    }
    for path, problem in cases.items():
        with pytest.raises(DataError) as info:
            checked(path)
        assert str(info.value).startswith(f"{path}: "), str(info.value)
        assert problem in str(info.value), (path.name, str(info.value))


# ------------------------------------------------------------------ short histories


def test_a_model_with_the_engines_age_reads_it_from_the_input_rows(mlflow_store, tmp_path,
                                                                    fd001):
    """include_cycle: the served model takes the age from each row's cycle number, so the same
    sensor rows numbered as an older engine predict differently; without it they do not."""
    older = fd001.test.assign(cycle=fd001.test["cycle"] + 100)
    answers = {}
    for include_cycle in (False, True):
        with mlflow.start_run():
            uri = log_pyfunc(tiny_outcome(fd001, include_cycle=include_cycle),
                             tmp_path / f"work{include_cycle}")
        served = mlflow.pyfunc.load_model(uri)
        answers[include_cycle] = [served.predict(rows)["rul"].to_numpy()
                                  for rows in (fd001.test, older)]
        inner = served.unwrap_python_model()
        last_column = inner.model.spec.preprocessing.feature_columns[-1]
        assert last_column == ("cycle" if include_cycle else "s_21")
    as_recorded, as_older = answers[True]
    np.testing.assert_array_equal(answers[False][0], answers[False][1])
    assert np.abs(as_recorded - as_older).max() > 1e-3


def test_short_unit_is_edge_padded_and_flagged(model, torch_outcome, fd001):
    preprocessor, network = torch_outcome.data.preprocessor, torch_outcome.model
    window = preprocessor.window
    test = fd001.test
    short = test[test["unit"] == 1].head(5)  # 5 rows, window 30
    exact = test[test["unit"] == 2].head(window)
    rows = pd.concat([short, exact])

    result = predict_frame(preprocessor, network, rows)
    served = model.predict(rows)

    assert result["unit"].tolist() == served["unit"].tolist() == [1, 2]
    assert result["padded"].tolist() == served["padded"].tolist() == [True, False]
    assert served["flagged"].tolist() == [True, False]
    assert served["flag_reason"].tolist() == ["5-row history, shorter than the window (30)", ""]
    np.testing.assert_allclose(served["rul"], result["rul"], atol=1e-3, rtol=0)
    # the padding rule: the first row repeated in front of the 5 real ones
    values = preprocessor.transform(short)
    padded_window = np.concatenate([np.repeat(values[:1], window - 5, axis=0), values])
    with torch.inference_mode():
        by_hand = network(torch.as_tensor(padded_window[None])).item()
    # float32 noise of a batch of 2 against a batch of 1 (MKL's products and oneDNN's kernels
    # differ by batch size; tanh by sigmoid rounds near 0 in steps of ~1e-7) is ~1e-5 cycles;
    # another
    # padding rule moves the prediction by cycles
    assert result["rul"].iloc[0] == pytest.approx(by_hand, abs=1e-4)


def test_short_unit_rejected_on_request_names_unit_and_rows(model, fd001):
    rows = pd.concat([fd001.test[fd001.test["unit"] == 1].head(5),
                      fd001.test[fd001.test["unit"] == 2]])
    with pytest.raises(MlflowException) as info:
        model.predict(rows, params={"short_history": "reject"})
    assert str(info.value.message) == (
        "input: history shorter than the window (30 cycles): unit 1 has 5 rows"
    )
    assert model.predict(rows)["padded"].tolist() == [True, False]  # default: pad


# ------------------------------------------------------------------ the pyfunc model


def test_pyfunc_accepts_rows_as_users_read_them(model, expected, real_data_dir):
    raw = raw_rows(real_data_dir)
    assert list(expected.columns) == ROWS_OUT
    assert len(expected) == 100 and not expected["padded"].any()
    for frame in (raw, raw.astype(np.float64)):
        result = model.predict(frame)
        pd.testing.assert_frame_equal(result, expected)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda f: f.drop(columns="s_4"), "s_4"),
        (lambda f: f.assign(s_7=f["s_7"].astype(object).where(f.index != 3, "high")),
         "row 4, column s_7: is not a number"),
        (lambda f: f.assign(s_7=f["s_7"].where(f.index != 3, np.inf)),
         "row 4, column s_7: is not finite"),
        (lambda f: f.assign(cycle=f["cycle"].where(f.index != 3, 3)),
         "unit 1: duplicate cycle 3 (row 4)"),
    ],
)
def test_pyfunc_rejects_what_rul_predict_rejects(model, fd001, edit, problem):
    rows = edit(fd001.test[fd001.test["unit"] <= 2].reset_index(drop=True))
    with pytest.raises(MlflowException) as info:
        model.predict(rows)
    assert problem in str(info.value.message)


def test_lean_model_predicts_what_the_torch_network_predicts(expected, torch_outcome, fd001):
    """The same weights through ONNX and through torch: within 1e-3 cycles on FD001's test
    set, every other column equal."""
    by_torch = predict_frame(torch_outcome.data.preprocessor, torch_outcome.model, fd001.test)
    np.testing.assert_allclose(expected["rul"], by_torch["rul"], atol=1e-3, rtol=0)
    pd.testing.assert_frame_equal(expected[["unit", "padded"]], by_torch[["unit", "padded"]])


def test_the_served_champion_scores_the_test_rmse_the_run_printed(model, fd001, torch_outcome):
    served = model.predict(fd001.test)["rul"].to_numpy()
    assert rul_metrics(served, fd001.test_rul, 125)["rmse"] == pytest.approx(
        torch_outcome.metrics["test_rmse"], abs=0.01)


def test_a_model_that_would_not_serve_the_printed_test_rmse_is_not_logged(fd001, mlflow_store,
                                                                       tmp_path):
    """The test units scored by another network than the one exported: the served model's
    test RMSE is not the run's, and logging it stops with both numbers; nothing is logged."""
    outcome = tiny_outcome(fd001, scored_seed=1)
    with mlflow.start_run() as run, pytest.raises(ExportError) as refused:
        log_pyfunc(outcome, tmp_path / "work")
    printed = outcome.metrics["test_rmse"]
    assert f"the run's {printed:.3f} (at most 0.01 apart)" in str(refused.value)
    assert MlflowClient().list_artifacts(run.info.run_id) == []


def test_logged_requirements_are_installable_and_lean(store):
    path = mlflow.pyfunc.get_model_dependencies(CHAMPION_URI)
    lines = [x for x in Path(path).read_text().splitlines() if x and not x.startswith("#")]
    names = {x.split("==")[0] for x in lines}
    assert names == {"mlflow-skinny", "onnxruntime", "numpy", "pandas", "sqlalchemy",
                     "alembic"}  # the last two: mlflow-skinny reads the default SQLite store
    assert not any("+" in x for x in lines), lines
    assert f"pandas=={pd.__version__.split('+')[0]}" in lines


def test_torch_weights_stay_with_the_run(store, fd001, torch_outcome):
    """weights/ beside the model: the state dict and the spec, enough to rebuild the network."""
    from rul.serving.torch_weights import load_torch_model

    run_id = mlflow.models.get_model_info(store.model_uri).run_id
    spec, networks = load_torch_model(run_id)
    assert spec.model == "cnn" and spec.onnx == () and len(networks) == 1
    for name, value in torch_outcome.model.state_dict().items():
        torch.testing.assert_close(networks[0].state_dict()[name], value, rtol=0, atol=0)
    rows = fd001.test[fd001.test["unit"] <= 3]
    pd.testing.assert_frame_equal(
        predict_frame(spec.preprocessing, networks, rows),
        predict_frame(torch_outcome.data.preprocessor, torch_outcome.model, rows))


def test_spec_with_unknown_and_missing_keys_still_loads(store, fd001, expected):
    """A spec written by another rul version: an extra key, no format_version, no dropout."""
    local = Path(mlflow.artifacts.download_artifacts(store.model_uri,
                                                     dst_path=str(store.root / "copy")))
    spec_path = local / "artifacts" / "inference" / "inference_spec.json"
    spec = json.loads(spec_path.read_text())
    assert {k: v for k, v in spec.items() if k not in ("preprocessing", "envelope")} == {
        "model": "cnn", "window": 30, "rul_cap": 125.0, "n_features": 14,
        "architecture": ARCH, "format_version": 1, "onnx": ["network.onnx"], "track": "sensors"}
    assert spec["preprocessing"]["feature_columns"][-1] == "s_21"
    spec["activation"] = "tanh"
    spec["architecture"]["stochastic_depth"] = 0.1
    del spec["format_version"], spec["architecture"]["dropout"]
    spec_path.write_text(json.dumps(spec))

    result = mlflow.pyfunc.load_model(str(local)).predict(fd001.test)

    pd.testing.assert_frame_equal(result, expected)


def test_spec_defaults_and_errors():
    base = {"model": "lstm", "window": 40, "rul_cap": 130, "n_features": 14}
    spec = InferenceSpec.from_dict({**base, "renamed_key": 1})
    assert spec.format_version == 1 and spec.architecture == {}
    lstm = spec.build_network()
    assert lstm.backbone.rnn.hidden_size == 100 and lstm.backbone.rnn.num_layers == 4
    assert InferenceSpec.from_dict({"model": "cnn"}, defaults={"window": 30, "rul_cap": 125,
                                                               "n_features": 14}).window == 30
    with pytest.raises(ValueError, match="format_version 2 is newer"):
        InferenceSpec.from_dict({**base, "format_version": 2})
    with pytest.raises(ValueError, match=r"lacks \['n_features'\]"):
        InferenceSpec.from_dict({k: v for k, v in base.items() if k != "n_features"})


def test_inference_imports_nothing_from_training(store, fd001):
    """With torch, scikit-learn, MLflow and the training tools impossible to import, the lean
    runtime loads the logged model's folder and predicts; with only torch and scikit-learn
    blocked, MLflow loads it as a pyfunc and predicts the same."""
    folder = mlflow.artifacts.download_artifacts(store.model_uri,
                                                 dst_path=str(store.root / "imports"))
    script = textwrap.dedent(f"""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def __init__(self, names):
                self.names = names
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in self.names:
                    raise ImportError("blocked: " + name)
        blocked = Block({(*FORBIDDEN, "torch", "sklearn", "scipy", "mlflow")!r})
        sys.meta_path.insert(0, blocked)
        from rul.data.reader import read_trajectories
        from rul.serving.runtime import LeanModel
        rows = read_trajectories(sys.argv[1])
        lean = LeanModel.load(sys.argv[2]).predict(rows)
        print(len(lean))
        assert not [m for m in sys.modules if m.split(".")[0] in blocked.names]
        blocked.names = {{"torch", "sklearn"}}
        import mlflow.pyfunc
        served = mlflow.pyfunc.load_model(sys.argv[2]).predict(rows)
        assert served.equals(lean), (served, lean)
        assert not [m for m in sys.modules if m.split(".")[0] in blocked.names]
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, str(fd001.files["test"]), folder], capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "100"


# ------------------------------------------------------------------ rul predict


def cli(*args):
    return CliRunner().invoke(main, ["predict", "--model", CHAMPION_URI, *args])


def test_cli_predict_reads_every_format_alike(store, tmp_path, expected, real_data_dir):
    raw = raw_rows(real_data_dir)
    inputs = [Path(real_data_dir) / "test_FD001.txt", write_csv(raw, tmp_path / "h.csv")]
    for path in inputs:
        result = cli("--input", str(path))
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[0] == ",".join(ROWS_OUT)
        printed = pd.read_csv(pd.io.common.StringIO(result.stdout))
        np.testing.assert_array_equal(printed["unit"], expected["unit"])
        np.testing.assert_allclose(printed["rul"], expected["rul"], atol=1e-4, rtol=0)
        assert not printed["padded"].any()


def test_cli_predict_writes_output_and_refuses_a_missing_folder(store, tmp_path, real_data_dir,
                                                                 expected):
    txt = str(Path(real_data_dir) / "test_FD001.txt")
    out = tmp_path / "pred.csv"
    result = cli("--input", txt, "--output", str(out))
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(pd.read_csv(out)["rul"], expected["rul"], atol=1e-4, rtol=0)
    assert [p.name for p in tmp_path.iterdir()] == ["pred.csv"]  # no partial file left

    missing = tmp_path / "no_such_folder" / "pred.csv"
    result = cli("--input", txt, "--output", str(missing))
    assert result.exit_code == 2
    assert f"folder {missing.parent} does not exist" in result.output
    assert "Traceback" not in result.output
    assert not missing.parent.exists()


def test_cli_predict_says_in_one_line_when_the_store_or_the_model_is_not_there(
        store, tmp_path, real_data_dir):
    """Reading never creates a store: a SQLite store that is not there is one line, and its
    folder is not made; a model the store lacks is one line naming the store."""
    txt = str(Path(real_data_dir) / "test_FD001.txt")
    missing = tmp_path / "nowhere" / "mlflow.db"
    result = CliRunner().invoke(main, ["predict", "--model", CHAMPION_URI, "--input", txt,
                                       "--tracking-uri", f"sqlite:///{missing}"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"Error: sqlite:///{missing}: no MLflow store there (set --tracking-uri or "
        "MLFLOW_TRACKING_URI)"]
    assert not missing.parent.exists()
    result = CliRunner().invoke(main, ["predict", "--model", "models:/no-such-model@champion",
                                       "--input", txt])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "Error: models:/no-such-model@champion: not in the store " in result.output
    assert "no-such-model not found" in result.output


def test_cli_predict_bad_inputs_are_clear_errors(store, tmp_path, fd001):
    rows = fd001.test[fd001.test["unit"] <= 2]
    header_only = tmp_path / "header_only.csv"
    header_only.write_text(",".join(COLUMNS) + "\n")
    repeated = rows.copy()
    repeated.iloc[3, 1] = repeated.iloc[2, 1]
    short = write_csv(rows.groupby("unit").head(5), tmp_path / "short.csv")
    cases = [
        ((header_only,), "header but no rows"),
        ((write_csv(repeated, tmp_path / "rep.csv"),), "unit 1: duplicate cycle 3 (row 4)"),
        ((write_csv(rows.drop(columns="s_4"), tmp_path / "no_s4.csv"),), "'s_4'"),
        ((short, "--short-history", "reject"),
         "history shorter than the window (30 cycles): unit 1 has 5 rows, unit 2 has 5 rows"),
    ]
    for (path, *extra), problem in cases:
        result = cli("--input", str(path), *extra)
        assert result.exit_code == 2, result.output
        assert f"{path}: " in result.output and problem in result.output, result.output
        assert "Traceback" not in result.output
    padded = cli("--input", str(short))
    assert padded.exit_code == 0
    assert pd.read_csv(pd.io.common.StringIO(padded.stdout))["padded"].tolist() == [True, True]


# ------------------------------------------------------------------ the DCNN's padding


@pytest.mark.parametrize("kernel", [2, 3, 10])
def test_time_conv_equals_same_padding_without_any_warning(kernel, recwarn):
    import warnings

    from rul.models.cnn import TimeConv

    torch.manual_seed(kernel)
    conv = TimeConv(2, 3, kernel)
    reference = torch.nn.Conv2d(2, 3, (kernel, 1), padding="same")
    reference.load_state_dict(conv.state_dict())
    x = torch.randn(4, 2, 30, 14)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = reference(x)
    recwarn.clear()
    out = conv(x)
    assert out.shape == expected.shape == (4, 3, 30, 14)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert not [w for w in recwarn if "padding" in str(w.message)]
    assert not [f for f in warnings.filters if "even kernel" in str(f[1])]  # no global filter


def test_models_logged_with_the_whole_config_still_load(tmp_path, fd001):
    """Before inference specs, models stored the training config (config.json)."""
    from rul.serving.pyfunc_model import load_spec

    outcome = tiny_outcome(fd001)
    config = {"model": "cnn", "window": 30, "rul_cap": 125, "lr": 1e-3, "epochs": 2,
              "removed_key": True, **ARCH}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_spec({"config": str(tmp_path / "config.json")}, outcome.data.preprocessor)
    assert spec == InferenceSpec("cnn", 30, 125.0, 14, ARCH, track="sensors")
    network = spec.build_network()
    network.load_state_dict(outcome.model.state_dict())  # same architecture, same keys


def log_legacy_model(outcome, workdir: Path) -> str:
    """Log `outcome` as rul logged models before the lean runtime: the pickled RULModel, the
    pickled Preprocessor, the state dict and a spec without preprocessing numbers."""
    import pickle

    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from mlflow.types.schema import AnyType

    from rul.serving.pyfunc_model import RULModel

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "preprocessor.pkl").write_bytes(pickle.dumps(outcome.data.preprocessor))
    torch.save(outcome.model.state_dict(), workdir / "model.pt")
    InferenceSpec.from_network(outcome.network_spec).write(workdir / "inference_spec.json")
    signature = ModelSignature(
        inputs=Schema([ColSpec(AnyType(), c) for c in COLUMNS]),
        outputs=Schema([ColSpec("long", "unit"), ColSpec("double", "rul"),
                        ColSpec("boolean", "padded")]),
        params=ParamSchema([ParamSpec("short_history", "string", "pad")]))
    info = mlflow.pyfunc.log_model(
        name="model", python_model=RULModel(), signature=signature,
        artifacts={"preprocessor": str(workdir / "preprocessor.pkl"),
                   "weights": str(workdir / "model.pt"),
                   "inference_spec": str(workdir / "inference_spec.json")},
        code_paths=[str(ROOT / "rul")], pip_requirements=["mlflow", "torch", "scikit-learn"])
    return info.model_uri


def test_models_logged_before_the_lean_runtime_still_load(mlflow_store, tmp_path, fd001,
                                                          torch_outcome):
    """A pickled RULModel with its torch weights loads in rul's environment and predicts as
    before: unit, rul, padded, the torch network's numbers."""
    with mlflow.start_run():
        uri = log_legacy_model(torch_outcome, tmp_path / "legacy")
    model = mlflow.pyfunc.load_model(uri)
    rows = fd001.test[fd001.test["unit"] <= 5]
    result = model.predict(rows)
    pd.testing.assert_frame_equal(
        result, predict_frame(torch_outcome.data.preprocessor, torch_outcome.model, rows))
    assert list(result.columns) == ["unit", "rul", "padded"]
    with pytest.raises(MlflowException, match="unit 1 has 5 rows"):
        model.predict(rows.groupby("unit").head(5), params={"short_history": "reject"})
    strict = CliRunner().invoke(main, ["predict", "--model", uri, "--input",
                                       str(write_csv(rows, tmp_path / "rows.csv")), "--strict",
                                       "--tracking-uri", mlflow.get_tracking_uri()])
    assert strict.exit_code == 2  # rul predict reads models as data: a pickle is not read
    assert strict.output == (f"Error: {uri}: not a rul model with ONNX networks (no inference/"
                             "inference_spec.json); one logged before rul's lean runtime loads "
                             "only with mlflow.pyfunc.load_model, which runs the model's code: "
                             "only from a registry you trust\n")


def test_cli_predict_warns_of_units_outside_the_fleet_and_strict_refuses(store, tmp_path,
                                                                          fd001):
    rows = fd001.test[fd001.test["unit"] <= 4].copy()
    rows.loc[(rows["unit"] == 3) & (rows["cycle"] == 5), "s_9"] = 1e9
    path = write_csv(rows, tmp_path / "glitch.csv")
    result = cli("--input", str(path))
    assert result.exit_code == 0, result.output
    printed = pd.read_csv(pd.io.common.StringIO(result.stdout))
    assert printed["flagged"].tolist() == [False, False, True, False]
    assert result.stderr.startswith("warning: 1 of 4 units lie outside the training fleet")
    assert "unit 3 (s_9 " in result.stderr and "(cycle 5))" in result.stderr
    assert len(result.stderr.splitlines()) == 1

    refused = cli("--input", str(path), "--strict")
    assert refused.exit_code == 2
    assert (f"{path}: outside the training fleet (strict): unit 3 (s_9 " in refused.output)
    assert "Traceback" not in refused.output
    clean = cli("--input", str(write_csv(rows[rows["unit"] != 3], tmp_path / "ok.csv")),
                "--strict")
    assert clean.exit_code == 0 and clean.stderr == ""


@pytest.mark.parametrize("level", ["WARNING", "ERROR", "CRITICAL"])
def test_a_misspelled_parameter_is_refused_at_every_mlflow_log_level(model, fd001, level):
    """MLflow drops an unknown parameter with a warning; rul refuses it from that warning,
    also when MLflow's log level (MLFLOW_LOGGING_LEVEL) hides warnings."""
    import logging

    mlflow_logger = logging.getLogger("mlflow")
    saved = mlflow_logger.level
    mlflow_logger.setLevel(level)
    try:
        with pytest.raises(MlflowException, match="unknown parameter 'horizn'"):
            model.predict(fd001.test, params={"horizn": 40})
    finally:
        mlflow_logger.setLevel(saved)

"""Inference anywhere: one validation for every input format, the pyfunc model, `rul predict`.

Most tests use a model logged without training (a fitted Preprocessor and a seeded, untrained
tiny network: the numbers are arbitrary but deterministic), registered as rul-fd001@champion in
a temporary SQLite store. The clean-environment test (slow) trains a tiny model for real.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
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
from rul.data.schema import COLUMNS
from rul.data.validation import validate_rows
from rul.inference import read_rows
from rul.models import NetworkSpec
from rul.preprocessing import Preprocessor
from rul.serving.predictor import InferenceSpec, predict_frame
from rul.tracking.model_logging import log_pyfunc

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "rul-fd001"
CHAMPION_URI = f"models:/{MODEL_NAME}@champion"
ARCH = {"filters": 4, "kernel_size": 10, "num_layers": 2, "hidden_size": 16, "dropout": 0.5}
FORBIDDEN = ("tqdm", "click", "yaml", "matplotlib", "optuna")


def tiny_outcome(fd001, window=30, include_cycle=False, interval=None):
    """What log_pyfunc reads from a training outcome, without the training."""
    preprocessor = Preprocessor(window=window, smoothing_alpha=0.1,
                                include_cycle=include_cycle).fit(fd001.train)
    torch.manual_seed(0)
    spec = NetworkSpec("cnn", preprocessor.n_features, window, 125, ARCH)
    network = spec.build().eval()
    return SimpleNamespace(network_spec=spec, models=[network], model=network,
                           interval=interval,
                           data=SimpleNamespace(preprocessor=preprocessor, subset=fd001))


def log_tiny_model(fd001, workdir: Path, register: bool = True, interval=None) -> str:
    """Log (and register as the champion) a tiny model to the current tracking store."""
    with mlflow.start_run():
        uri = log_pyfunc(tiny_outcome(fd001, interval=interval), workdir)
    if register:
        version = mlflow.register_model(uri, MODEL_NAME).version
        MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", version)
    return uri


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
    """In-process predictions on the typed FD001 test set."""
    inner = model.unwrap_python_model()
    return predict_frame(inner.preprocessor, inner.model, fd001.test)


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
        ("s_3", "abc", "row 6, column s_3: 'abc' is not a number"),
        ("s_3", np.inf, "row 6, column s_3: value inf is not finite"),
        ("setting_1", -np.inf, "row 6, column setting_1: value -inf is not finite"),
        ("s_21", np.nan, "row 6, column s_21: is missing"),
        ("cycle", 6.5, "row 6: cycle 6.5 is not a positive whole number"),
        ("unit", 0, "row 6: unit 0 is not a positive whole number"),
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


def test_validate_rows_ignores_extra_columns_and_keeps_unit_order(fd001):
    two = fd001.test[fd001.test["unit"].isin([1, 2])]
    swapped = pd.concat([two[two["unit"] == 2], two[two["unit"] == 1]]).assign(note="x")
    typed = validate_rows(swapped)
    assert list(typed.columns) == COLUMNS
    assert typed["unit"].iloc[0] == 2 and typed["unit"].iloc[-1] == 1


# ------------------------------------------------------------------ read_rows: formats


def write_csv(frame, path, header=True):
    frame.to_csv(path, index=False, header=header)
    return path


def test_every_format_reads_to_the_same_typed_rows(tmp_path, fd001, real_data_dir):
    txt = Path(real_data_dir) / "test_FD001.txt"
    raw = raw_rows(real_data_dir)  # s_17, s_18 integers: written as "392", not "392.0"
    formats = {
        "txt": txt,
        "csv_header": write_csv(raw, tmp_path / "header.csv"),
        "csv_no_header": write_csv(raw, tmp_path / "bare.csv", header=False),
        "csv_floats": write_csv(raw.astype(float), tmp_path / "floats.csv"),
        "csv_reordered": write_csv(raw[COLUMNS[::-1]], tmp_path / "reordered.csv"),
    }
    assert "392," in (tmp_path / "bare.csv").read_text().splitlines()[0]
    for name, path in formats.items():
        pd.testing.assert_frame_equal(read_rows(path), fd001.test.reset_index(drop=True),
                                      obj=name)


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
        write_csv(rows.iloc[:, :20], tmp_path / "narrow.csv", header=False):
            "expected a header naming the columns or 26 columns",
        write_csv(rows.drop(columns="s_4"), tmp_path / "no_s4.csv"): "missing columns ['s_4']",
        write_csv(repeated, tmp_path / "repeated.csv"): "unit 1: duplicate cycle 3 (row 4)",
        write_csv(bad_value, tmp_path / "bad.csv", header=False):
            "row 10, column s_2: 'n/a' is not a number",
        tmp_path / "absent.csv": "file not found",
    }
    for path, problem in cases.items():
        with pytest.raises(DataError) as info:
            read_rows(path)
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
        last_column = inner.preprocessor.feature_columns_[-1]
        assert last_column == ("cycle" if include_cycle else "s_21")
    as_recorded, as_older = answers[True]
    np.testing.assert_array_equal(answers[False][0], answers[False][1])
    assert np.abs(as_recorded - as_older).max() > 1e-3


def test_short_unit_is_edge_padded_and_flagged(model, fd001):
    inner = model.unwrap_python_model()
    window = inner.preprocessor.window
    test = fd001.test
    short = test[test["unit"] == 1].head(5)  # 5 rows, window 30
    exact = test[test["unit"] == 2].head(window)
    rows = pd.concat([short, exact])

    result = predict_frame(inner.preprocessor, inner.model, rows)

    assert result["unit"].tolist() == [1, 2]
    assert result["padded"].tolist() == [True, False]
    # the padding rule: the first row repeated in front of the 5 real ones
    values = inner.preprocessor.transform(short)
    padded_window = np.concatenate([np.repeat(values[:1], window - 5, axis=0), values])
    with torch.inference_mode():
        by_hand = inner.model(torch.as_tensor(padded_window[None])).item()
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
    assert list(expected.columns) == ["unit", "rul", "padded"]
    assert len(expected) == 100 and not expected["padded"].any()
    for frame in (raw, raw.astype(np.float64)):
        result = model.predict(frame)
        pd.testing.assert_frame_equal(result, expected)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda f: f.drop(columns="s_4"), "s_4"),
        (lambda f: f.assign(s_7=f["s_7"].astype(object).where(f.index != 3, "high")),
         "row 4, column s_7: 'high' is not a number"),
        (lambda f: f.assign(s_7=f["s_7"].where(f.index != 3, np.inf)),
         "row 4, column s_7: value inf is not finite"),
        (lambda f: f.assign(cycle=f["cycle"].where(f.index != 3, 3)),
         "unit 1: duplicate cycle 3 (row 4)"),
    ],
)
def test_pyfunc_rejects_what_rul_predict_rejects(model, fd001, edit, problem):
    rows = edit(fd001.test[fd001.test["unit"] <= 2].reset_index(drop=True))
    with pytest.raises(MlflowException) as info:
        model.predict(rows)
    assert problem in str(info.value.message)


def test_logged_requirements_are_installable_and_lean(store):
    path = mlflow.pyfunc.get_model_dependencies(CHAMPION_URI)
    lines = [x for x in Path(path).read_text().splitlines() if x and not x.startswith("#")]
    names = {x.split("==")[0] for x in lines}
    assert names == {"mlflow", "torch", "numpy", "pandas", "scikit-learn", "cloudpickle"}
    assert not any("+" in x for x in lines), lines
    assert f"torch=={torch.__version__.split('+')[0]}" in lines


def test_spec_with_unknown_and_missing_keys_still_loads(store, fd001, expected):
    """A spec written by another rul version: an extra key, no format_version, no dropout."""
    local = Path(mlflow.artifacts.download_artifacts(store.model_uri,
                                                     dst_path=str(store.root / "copy")))
    spec_path = local / "artifacts" / "inference_spec.json"
    spec = json.loads(spec_path.read_text())
    assert spec == {"model": "cnn", "window": 30, "rul_cap": 125.0, "n_features": 14,
                    "architecture": ARCH, "format_version": 1}
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


def test_inference_imports_nothing_from_training(fd001):
    """With tqdm, click, YAML, matplotlib and optuna impossible to import, the serving code
    imports and predicts; importing the pyfunc module adds only rul modules to mlflow's."""
    script = textwrap.dedent(f"""
        import sys, importlib.abc
        FORBIDDEN = {FORBIDDEN!r}
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in FORBIDDEN:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import numpy, pandas, torch
        from rul.data.reader import read_trajectories
        from rul.models import build_network
        from rul.preprocessing import Preprocessor
        from rul.serving.predictor import predict_frame
        rows = read_trajectories(sys.argv[1])
        prep = Preprocessor().fit(rows)
        net = build_network("cnn", prep.n_features, 30, 125).eval()
        print(len(predict_frame(prep, net, rows)))
        assert not [m for m in sys.modules if m.split(".")[0] in FORBIDDEN]
        sys.meta_path.pop(0)
        import mlflow.pyfunc, sklearn.cluster, sklearn.preprocessing
        before = set(sys.modules)
        import rul.serving.pyfunc_model
        added = sorted(m for m in set(sys.modules) - before if not m.startswith("rul"))
        print("added", added)
        assert not added, added
    """)
    done = subprocess.run(
        [sys.executable, "-c", script, str(fd001.files["test"])], capture_output=True,
        text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "100"


# ------------------------------------------------------------------ rul predict


def cli(*args):
    return CliRunner().invoke(main, ["predict", "--model", CHAMPION_URI, *args])


def test_cli_predict_reads_every_format_alike(store, tmp_path, expected, real_data_dir):
    raw = raw_rows(real_data_dir)
    inputs = [Path(real_data_dir) / "test_FD001.txt", write_csv(raw, tmp_path / "h.csv"),
              write_csv(raw, tmp_path / "n.csv", header=False)]
    for path in inputs:
        result = cli("--input", str(path))
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[0] == "unit,rul,padded"
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


# ------------------------------------------------------------------ a clean environment


@pytest.mark.slow
def test_champion_loads_in_a_clean_virtualenv_without_rul(tmp_path, real_data_dir):
    """A virtualenv built from the model's own requirements.txt, rul not installed, another
    working directory: the registered champion loads by alias and predicts the FD001 test set
    with the numbers of the training run."""
    from rul import config as cfg
    from rul.tracking.tracked_run import train_tracked

    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store}/mlflow.db"
    patch = pytest.MonkeyPatch()
    patch.chdir(store)
    try:
        config = cfg.load(ROOT / "experiments" / "fd001.yaml", {
            "epochs": 2, "filters": 4, "num_layers": 2, "hidden_size": 16,
            "micro_batch_size": 1024, "accumulation_steps": 1, "tracking_uri": uri,
            "checkpoint_dir": str(store / "ckpt"), "data_dir": str(real_data_dir)})
        outcome, _ = train_tracked(config, progress=False)
        requirements = mlflow.pyfunc.get_model_dependencies(CHAMPION_URI)
    finally:
        mlflow.set_tracking_uri(None)
        patch.undo()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    started = time.monotonic()
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "-r", requirements],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = textwrap.dedent("""
        import importlib.util, sys, mlflow
        assert importlib.util.find_spec("rul") is None, "rul is importable before loading"
        model = mlflow.pyfunc.load_model("models:/rul-fd001@champion")
        import pandas as pd
        names = ["unit", "cycle"] + [f"setting_{i}" for i in (1, 2, 3)]
        names += [f"s_{i}" for i in range(1, 22)]
        rows = pd.read_csv(sys.argv[1], sep=r"\\s+", header=None, names=names)
        model.predict(rows).to_csv(sys.argv[2], index=False)
        print("tqdm" in sys.modules, "yaml" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MLFLOW_TRACKING_URI"] = uri
    out = tmp_path / "predictions.csv"
    done = subprocess.run([python, "-c", script, str(Path(real_data_dir) / "test_FD001.txt"),
                           str(out)], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = pd.read_csv(out)
    np.testing.assert_array_equal(result["unit"], outcome.predictions["unit"])
    np.testing.assert_allclose(result["rul"], outcome.predictions["predicted_rul"],
                               atol=1e-4, rtol=0)
    assert not result["padded"].any()
    print(f"clean venv: pip install {time.monotonic() - started:.0f} s")
    shutil.rmtree(venv, ignore_errors=True)


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
    assert spec == InferenceSpec("cnn", 30, 125.0, 14, ARCH)
    network = spec.build_network()
    network.load_state_dict(outcome.model.state_dict())  # same architecture, same keys

"""`rul predict` and rul's server read a model folder as data: its inference spec and ONNX
files by rul's own code (rul.serving.served), never the folder's code/ nor its model file,
which MLflow's models-from-code would run. A folder that is not a rul model, or whose spec
names files elsewhere, is one line."""

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from test_inference import tiny_model_folder

from rul.cli import main
from rul.serving import server
from rul.serving.limits import Limits


@pytest.fixture(scope="module")
def planted(tmp_path_factory, fd001):
    """A tiny model folder whose every Python file writes a marker when run."""
    root = tmp_path_factory.mktemp("planted")
    folder = Path(tiny_model_folder(fd001, root))
    marker = root / "ran"
    for path in folder.rglob("*.py"):
        path.write_text(path.read_text() + f"\nimport pathlib\npathlib.Path({str(marker)!r})"
                                           ".write_text('ran')\n")
    return folder, marker


def test_rul_predict_reads_a_model_folder_and_runs_none_of_its_code(planted, real_data_dir,
                                                                    tmp_path):
    folder, marker = planted
    result = CliRunner().invoke(main, ["predict", "--model", str(folder), "--input",
                                       str(real_data_dir / "test_FD001.txt"), "--output",
                                       str(tmp_path / "out.csv")])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(tmp_path / "out.csv")) == 100
    assert not marker.exists()


def test_the_server_loads_a_model_folder_and_runs_none_of_its_code(planted, tmp_path):
    folder, marker = planted
    guard = server.build(str(folder), Limits(), str(tmp_path))
    try:
        assert guard.lanes.worker_pids()  # the worker loaded it too
    finally:
        guard.lanes.close()
    assert not marker.exists()


def test_a_folder_that_is_not_a_rul_model_is_one_line(tmp_path, capsys, real_data_dir):
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    with pytest.raises(SystemExit) as ended:
        server.main([str(tmp_path)])
    line = (f"error: {tmp_path}: not a rul model with ONNX networks (no inference/"
            "inference_spec.json); one logged before rul's lean runtime loads only with "
            "mlflow.pyfunc.load_model, which runs the model's code: only from a registry you "
            "trust\n")
    assert (ended.value.code, capsys.readouterr().err) == (2, line)
    result = CliRunner().invoke(main, ["predict", "--model", str(tmp_path), "--input",
                                       str(real_data_dir / "test_FD001.txt")])
    assert (result.exit_code, result.output) == (2, f"Error: {line.removeprefix('error: ')}")


@pytest.mark.parametrize("change", ["../../../elsewhere.onnx", "ABSOLUTE", "{not json",
                                    "[" * 100_000])
def test_a_spec_that_names_files_elsewhere_or_is_not_json_is_one_line(planted, tmp_path,
                                                                       real_data_dir, change):
    """A spec naming a network outside its folder (a working one, planted there), one that is
    not JSON, one nested past Python's recursion limit."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(planted[0], folder)
    inference = folder / "artifacts" / "inference"
    shutil.copy(inference / "network.onnx", tmp_path / "elsewhere.onnx")
    spec = inference / "inference_spec.json"
    if change.endswith(".onnx") or change == "ABSOLUTE":
        named = str(tmp_path / "elsewhere.onnx") if change == "ABSOLUTE" else change
        spec.write_text(json.dumps({**json.loads(spec.read_text()), "onnx": [named]}))
    else:
        spec.write_text(change)
    result = CliRunner().invoke(main, ["predict", "--model", str(folder), "--input",
                                       str(real_data_dir / "test_FD001.txt")])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith(f"Error: {folder}: not a readable rul model: ")


def test_rul_predict_reads_a_store_it_cannot_write(planted, real_data_dir, tmp_path,
                                                   monkeypatch):
    """Predicting only reads: a store whose folder this user cannot write (as another user
    meets it: the tests run as root) is used as it is, and none is created."""
    import os

    from rul.tracking import store

    folder, _ = planted
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked
                        else real_access(path, mode))
    store._ready.clear()
    result = CliRunner().invoke(main, [
        "predict", "--model", str(folder), "--input", str(real_data_dir / "test_FD001.txt"),
        "--output", str(tmp_path / "out.csv"), "--tracking-uri",
        f"sqlite:///{locked}/mlflow.db"])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(tmp_path / "out.csv")) == 100
    assert list(locked.iterdir()) == []

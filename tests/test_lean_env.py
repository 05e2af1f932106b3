"""The champion where a consumer runs it: a clean virtualenv built from the model's own
requirements.txt (mlflow-skinny, onnxruntime, numpy, pandas, SQLAlchemy, alembic), rul not
installed, another working directory, the registry read from the default SQLite store, through
a tracking server, and the model from a plain folder. Slow (it installs from the
package index); CI runs it.

It checks that torch and scikit-learn are not importable there, that
`mlflow.pyfunc.load_model("models:/rul-fd001@champion")` predicts FD001's test set as the
training's torch network did (within 1e-3 cycles), the same from SQLite, a server and a
copied folder, that the small loader predicts the same from the model's folder without
MLflow, and that the environment stays under 450 MB. It prints
the sizes and times it measured.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from conftest import wait_until_answering
from test_inference import CHAMPION_URI, ROOT

from rul.data.schema import COLUMNS

pytestmark = pytest.mark.slow

MAX_ENV_MB = 450
SERVER_START_S = 180


def folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


LEAN_SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys, time
    started = time.perf_counter()
    import mlflow.pyfunc
    imported = time.perf_counter()
    found = {name: importlib.util.find_spec(name) is not None
             for name in ("torch", "sklearn", "rul", "mlflow.pyfunc")}
    model = mlflow.pyfunc.load_model("models:/rul-fd001@champion")
    loaded = time.perf_counter()
    import pandas as pd
    names = ["unit", "cycle"] + [f"setting_{i}" for i in (1, 2, 3)]
    names += [f"s_{i}" for i in range(1, 22)]
    rows = pd.read_csv(sys.argv[1], sep=r"\\s+", header=None, names=names)
    model.predict(rows).to_csv(sys.argv[2], index=False)
    folder = mlflow.artifacts.download_artifacts("models:/rul-fd001@champion",
                                                 dst_path=sys.argv[3])
    copied = mlflow.pyfunc.load_model(folder)  # a plain folder the model was copied to
    assert copied.predict(rows).equals(model.predict(rows))
    print(json.dumps({"found": found, "import_s": imported - started,
                      "load_s": loaded - imported, "folder": folder,
                      "torch_loaded": "torch" in sys.modules,
                      "sklearn_loaded": "sklearn" in sys.modules}))
""")

# The small loader: the model folder alone, with the rul code it carries; no MLflow.
NO_MLFLOW_SCRIPT = textwrap.dedent("""
    import json, sys, time
    started = time.perf_counter()
    sys.path.insert(0, sys.argv[1] + "/code")
    from rul.serving.runtime import LeanModel
    model = LeanModel.load(sys.argv[1])
    loaded = time.perf_counter()
    import pandas as pd
    names = ["unit", "cycle"] + [f"setting_{i}" for i in (1, 2, 3)]
    names += [f"s_{i}" for i in range(1, 22)]
    rows = pd.read_csv(sys.argv[2], sep=r"\\s+", header=None, names=names)
    model.predict(rows).to_csv(sys.argv[3], index=False)
    print(json.dumps({"load_s": loaded - started,
                      "mlflow_loaded": any(m.split(".")[0] == "mlflow" for m in sys.modules)}))
""")


def test_champion_runs_in_a_lean_virtualenv(tmp_path, real_data_dir):
    from rul import config as cfg
    from rul.workflows.train import train_tracked

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
    names = {line.split("==")[0] for line in Path(requirements).read_text().split()}
    assert names == {"mlflow-skinny", "onnxruntime", "numpy", "pandas", "sqlalchemy",
                     "alembic"}

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    started = time.monotonic()
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "-r", requirements],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    installed_s = time.monotonic() - started
    size = folder_mb(venv)
    assert size <= MAX_ENV_MB, f"the lean environment takes {size:.0f} MB"

    # the README's two lines as written, against the default store (SQLite), from another
    # working directory: MLFLOW_TRACKING_URI names the store
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    test_file = str(Path(real_data_dir) / "test_FD001.txt")
    by_sqlite = subprocess.run(
        [python, "-c", LEAN_SCRIPT, test_file, str(tmp_path / "sqlite.csv"),
         str(tmp_path / "sqlite-folder")], cwd=elsewhere, capture_output=True, text=True,
        env={**env, "MLFLOW_TRACKING_URI": uri}, timeout=300)
    assert by_sqlite.returncode == 0, by_sqlite.stderr[-3000:]
    sqlite_report = json.loads(by_sqlite.stdout.strip().splitlines()[-1])

    # and through a tracking server
    port = _free_port()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=store, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "tracking server silent"
                time.sleep(1)
        env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{port}"
        done = subprocess.run(
            [python, "-c", LEAN_SCRIPT, test_file, str(tmp_path / "lean.csv"),
             str(tmp_path / "folder")], cwd=elsewhere, env=env, capture_output=True,
            text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["found"] == {"torch": False, "sklearn": False, "rul": False,
                               "mlflow.pyfunc": True}
    assert not report["torch_loaded"] and not report["sklearn_loaded"]

    lean = pd.read_csv(tmp_path / "lean.csv")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "sqlite.csv"), lean)
    expected = outcome.predictions
    np.testing.assert_array_equal(lean["unit"], expected["unit"])
    np.testing.assert_allclose(lean["rul"], expected["predicted_rul"], atol=1e-3, rtol=0)
    for bound in ("rul_lower", "rul_upper"):
        np.testing.assert_allclose(lean[bound], expected[f"predicted_{bound}"], atol=1e-3,
                                   rtol=0)
    assert not lean["padded"].any() and lean["flagged"].mean() <= 0.02

    bare = subprocess.run(
        [python, "-c", NO_MLFLOW_SCRIPT, report["folder"], test_file,
         str(tmp_path / "bare.csv")], cwd=elsewhere, env=env, capture_output=True, text=True,
        timeout=300)
    assert bare.returncode == 0, bare.stderr[-3000:]
    bare_report = json.loads(bare.stdout.strip().splitlines()[-1])
    assert not bare_report["mlflow_loaded"]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "bare.csv"), lean)

    # the served model from that environment, with the documented command: the guarded
    # server run from the model folder's code/
    port = _free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 (closed below)
    serving = subprocess.Popen(
        [python, "-m", "rul.serving.server", report["folder"], "--port", str(port)],
        cwd=elsewhere, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**env, "PYTHONPATH": str(Path(report["folder"]) / "code")})
    try:
        wait_until_answering(serving, f"http://127.0.0.1:{port}/ping", tmp_path / "serve.log",
                             SERVER_START_S)
        rows = pd.read_csv(test_file, sep=r"\s+", header=None, names=COLUMNS)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=rows.to_csv(index=False).encode(),
            headers={"Content-Type": "text/csv"})
        with urllib.request.urlopen(request, timeout=120) as response:
            served = pd.DataFrame(json.loads(response.read())["predictions"])
        # no pyarrow in the lean environment: a Parquet body is refused saying so
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=rows.head(40).to_parquet(),
            headers={"Content-Type": "application/vnd.apache.parquet"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=120)
        assert refused.value.code == 415
        assert json.loads(refused.value.read())["message"] == (
            "body: Parquet needs pyarrow, which this server's environment lacks; send JSON or "
            "CSV")
    finally:
        os.killpg(serving.pid, 15)
        serving.wait(timeout=30)
        log.close()
    np.testing.assert_allclose(served["rul"], lean["rul"], atol=1e-9, rtol=0)
    print(f"lean venv: {size:.0f} MB, pip install {installed_s:.0f} s, import mlflow.pyfunc "
          f"{report['import_s']:.2f} s, load_model {report['load_s']:.2f} s (from SQLite "
          f"{sqlite_report['load_s']:.2f} s), "
          f"small loader (imports included) {bare_report['load_s']:.2f} s")
    shutil.rmtree(venv, ignore_errors=True)

"""Forged entries in rul's user cache change nothing a training computes or serves (end-to-end).

After a first `rul train` has filled the cache, the graph it traced is replaced by one that
halves its answer on smooth windows (every real window), a store with a trigger is planted
where rul once kept an empty store to copy, and the precision figures are a symlink to a file
outside. The next `rul train` on a new store says each doubt in one line, writes nothing
through the symlink, builds a store without the trigger, and registers a champion whose served
test RMSE is the one it printed.
"""

import os
import re
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_lean_runtime import halved_when_smooth

from rul.files import USER_CACHE_ENV
from rul.training import hardware

ROOT = Path(__file__).resolve().parents[1]
TINY = ["epochs=2", "filters=4", "num_layers=2", "hidden_size=16", "micro_batch_size=1024",
        "accumulation_steps=1", "--no-progress"]


def rul(*args, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "rul", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done


@pytest.mark.slow
def test_forged_cache_entries_change_nothing_trained_or_served(tmp_path, real_data_dir):
    import mlflow

    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), USER_CACHE_ENV: str(cache)}
    env.pop("MLFLOW_TRACKING_URI", None)
    train = ["train", *TINY, f"data_dir={real_data_dir}"]
    (tmp_path / "first").mkdir()
    rul(*train, cwd=tmp_path / "first", env=env)

    (graph,) = (cache / "onnx-graphs").iterdir()
    graph.write_bytes(halved_when_smooth(graph.read_bytes()))
    store = cache / "mlflow-stores" / f"mlflow-{mlflow.__version__}.db"
    store.parent.mkdir()
    with closing(sqlite3.connect(tmp_path / "first" / "mlflow.db")) as built, \
            closing(sqlite3.connect(store)) as planted:
        built.backup(planted)
        planted.execute("CREATE TRIGGER forged AFTER INSERT ON model_versions BEGIN UPDATE "
                        "model_versions SET storage_location = 'file:///elsewhere'; END")
        planted.commit()
    victim = outside / "victim"
    victim.write_text("untouched")
    precision = tmp_path / "private" / "precision.json"
    precision.parent.mkdir(mode=0o700)
    precision.symlink_to(victim)
    env["RUL_PRECISION_CACHE"] = str(precision)

    work = tmp_path / "second"
    work.mkdir()
    done = rul(*train, cwd=work, env=env)
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: rul")]
    expected = [f"warning: rul's cache: {graph}: does not compute what the network computes; "
                "not trusted, built anew"]
    if hardware.cpu_has_native_bf16():  # precision auto reads the figures here
        expected.insert(0, f"warning: rul's cache: {precision}: a symbolic link; not trusted, "
                           "built anew")
    assert warnings == expected
    assert victim.read_text() == "untouched"
    with closing(sqlite3.connect(work / "mlflow.db")) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'forged'").fetchall() == []

    printed = float(re.search(r"test RMSE ([\d.]+)", done.stdout + done.stderr).group(1))
    rul("predict", "--model", "models:/rul-fd001@champion", "--input",
        str(real_data_dir / "test_FD001.txt"), "--output", str(work / "served.csv"),
        cwd=work, env=env)
    served = pd.read_csv(work / "served.csv")["rul"].to_numpy()
    true = np.minimum(np.loadtxt(real_data_dir / "RUL_FD001.txt"), 125)
    assert np.sqrt(np.mean((served - true) ** 2)) == pytest.approx(printed, abs=0.01)

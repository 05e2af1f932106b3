"""`python -m bench lean`: the registered model where a consumer runs it.

Trains the default recipe for one epoch into a scratch store (the default network's size; its
accuracy does not matter here), registers it as `rul-fd001@champion`, builds a clean
virtualenv from the model's own requirements.txt and measures there, each in a fresh process:
- the environment's size on disk and its pip install time;
- `import mlflow.pyfunc`;
- `mlflow.pyfunc.load_model("models:/rul-fd001@champion")` from the SQLite store, as the
  README writes it, and the same with `suppress_warnings=True`, which skips MLflow's check of
  the installed packages against the model's requirements (the check only warns); both again
  in rul's own environment, where many more packages make the check slower;
- `model.predict` of one engine (FD001 test unit 1, 31 rows) and of all 100 test engines
  (13,096 rows): the median of repeated calls after one warm-up call;
- the small loader (`LeanModel.load`, no MLflow).

No mlflow or torch is imported in this process before the training (bench/__main__ imports
torch); the measuring processes import neither torch nor rul's installed package.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_URI = "models:/rul-fd001@champion"

MEASURE = textwrap.dedent("""
    import json, statistics, sys, time
    started = time.perf_counter()
    import mlflow.pyfunc
    imported = time.perf_counter()
    model = mlflow.pyfunc.load_model(sys.argv[2], suppress_warnings=sys.argv[3] == "skip")
    loaded = time.perf_counter()
    import pandas as pd
    names = ["unit", "cycle"] + [f"setting_{i}" for i in (1, 2, 3)]
    names += [f"s_{i}" for i in range(1, 22)]
    rows = pd.read_csv(sys.argv[1], sep=r"\\s+", header=None, names=names)
    one = rows[rows["unit"] == 1]
    def median_ms(frame, repeats):
        model.predict(frame)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model.predict(frame)
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times)
    print(json.dumps({"import_s": imported - started, "load_s": loaded - imported,
                      "one_ms": median_ms(one, 20), "all_ms": median_ms(rows, 5),
                      "rows": len(rows), "one_rows": len(one),
                      "torch": "torch" in sys.modules}))
""")

SMALL_LOADER = textwrap.dedent("""
    import json, sys, time
    started = time.perf_counter()
    sys.path.insert(0, sys.argv[1] + "/code")
    from rul.serving.runtime import LeanModel
    LeanModel.load(sys.argv[1])
    print(json.dumps({"load_s": time.perf_counter() - started}))
""")


def folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _champion(store: Path, data_dir: Path) -> Path:
    """Train and register the default recipe (1 epoch) into `store`; its requirements.txt."""
    import mlflow

    from rul import config as cfg
    from rul.workflows.train import train_tracked

    uri = f"sqlite:///{store}/mlflow.db"
    here = os.getcwd()
    os.chdir(store)
    try:
        config = cfg.load(ROOT / "experiments" / "fd001.yaml", {
            "epochs": 1, "tracking_uri": uri, "checkpoint_dir": str(store / "ckpt"),
            "data_dir": str(data_dir)})
        train_tracked(config, progress=False)
        return Path(mlflow.pyfunc.get_model_dependencies(MODEL_URI))
    finally:
        mlflow.set_tracking_uri(None)
        os.chdir(here)


def _run(python: str, script: str, *args, cwd: Path, env: dict) -> dict:
    done = subprocess.run([python, "-c", script, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        sys.exit(f"lean: the measuring process failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_lean() -> dict:
    data_dir = Path(os.environ.get("CMAPSS_DIR", ROOT / "data" / "cmapss"))
    test_file = str(data_dir / "test_FD001.txt")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        store = scratch / "store"
        store.mkdir()
        requirements = _champion(store, data_dir)
        venv = scratch / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        started = time.perf_counter()
        subprocess.run([python, "-m", "pip", "install", "-q", "-r", str(requirements)],
                       check=True, capture_output=True)
        install_s = time.perf_counter() - started
        size = folder_mb(venv)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}/mlflow.db"
        elsewhere = scratch / "elsewhere"
        elsewhere.mkdir()
        checked = _run(python, MEASURE, test_file, MODEL_URI, "check", cwd=elsewhere, env=env)
        skipped = _run(python, MEASURE, test_file, MODEL_URI, "skip", cwd=elsewhere, env=env)
        folder = subprocess.run(
            [python, "-c", "import mlflow, sys; print(mlflow.artifacts.download_artifacts("
             "sys.argv[1], dst_path=sys.argv[2]))", MODEL_URI, str(scratch / "model")],
            cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip().splitlines()[-1]
        small = _run(python, SMALL_LOADER, folder, cwd=elsewhere, env=env)
        full = [_run(sys.executable, MEASURE, test_file, MODEL_URI, how, cwd=elsewhere,
                     env=env)["load_s"] for how in ("check", "skip")]

    def check_share(with_check: float, without: float) -> str:
        spent = max(0.0, with_check - without)
        return f"{without:.2f} s (the check took {spent:.2f} s, {spent / with_check:.0%})"

    figures = {
        "lean environment (requirements.txt of the model)": f"{size:.0f} MB, "
                                                             f"pip install {install_s:.0f} s",
        "import mlflow.pyfunc": f"{checked['import_s']:.2f} s",
        "load_model from SQLite (as in the README)": f"{checked['load_s']:.2f} s",
        "load_model(..., suppress_warnings=True): no dependency check": check_share(
            checked["load_s"], skipped["load_s"]),
        "the same in rul's own environment (many packages): with / without the check":
            f"{full[0]:.2f} s / " + check_share(*full),
        f"predict 1 engine ({checked['one_rows']} rows), median": f"{checked['one_ms']:.0f} ms",
        f"predict 100 engines ({checked['rows']:,} rows), median": f"{checked['all_ms']:.0f} ms",
        "small loader, imports included (no MLflow)": f"{small['load_s']:.2f} s",
        "torch imported": "no" if not checked["torch"] else "YES",
    }
    for what, value in figures.items():
        print(f"lean: {what}: {value}")
    return {"columns": ["what", "measured"], "rows": [[k, v] for k, v in figures.items()],
            "summary": {"load_model (s)": round(checked["load_s"], 2)}}

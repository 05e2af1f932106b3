"""Shared fixtures: the real C-MAPSS copy (when there is one) and small synthetic C-MAPSS files.

Synthetic files follow the real format: one row per cycle, 26 space-separated columns
(`unit cycle setting_1..3 s_1..s_21`), rows of a unit contiguous with strictly increasing cycles.
They are built from a seeded numpy RNG, so every run writes the same bytes.

MLflow tests get a fresh store in a temporary folder: `mlflow_store` (per test), the
`mlflow_store_at` context manager (for module fixtures and blocks inside a test), or
`fd001_store` (per module, on the real FD001 data, with the tiny training's config builder).
`mlflow_ui` serves a store as `make ui` does and stops it as Ctrl-C does.
`postgres_cluster` starts a throwaway PostgreSQL server (skipped without Debian's server
binaries, a failure on CI, which installs them).
"""

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import psutil
import pytest

from rul.data.schema import COLUMNS, INFORMATIVE_SENSORS, SENSOR_COLUMNS, SETTING_COLUMNS

# The test files, longest first (seconds of both tiers together), as tests/durations.json
# records them: the Makefile hands whole files to parallel workers in this order
# (--no-loadscope-reorder), so the long ones start early and the workers finish together. A
# file the record lacks starts last and may run alone at the end (the README's commands, 8
# minutes of the end-to-end tier, did). `make test-durations` runs both tiers and records them
# again (RECORD_ENV names the file to write).
DURATIONS = Path(__file__).with_name("durations.json")
RECORD_ENV = "RUL_RECORD_DURATIONS"


def longest_first(path: Path = DURATIONS) -> list[str]:
    """The test files of the record, in its order (longest first)."""
    return [row["file"] for row in json.loads(path.read_text())["files"]]


def write_durations(path: Path, seconds: dict[str, float], recorded: str) -> None:
    """Record `seconds` by test file, longest first; a file of the old record that did not
    run keeps its row, after them (a run of some files alone loses nobody's place)."""
    old = json.loads(path.read_text())["files"] if path.exists() else []
    rows = [{"file": name, "seconds": round(took, 1)}
            for name, took in sorted(seconds.items(), key=lambda item: -item[1])]
    rows += [row for row in old if row["file"] not in seconds]
    lines = ",\n".join(f"  {json.dumps(row)}" for row in rows)
    path.write_text(f'{{"command": "make test-durations",\n "recorded": {json.dumps(recorded)},'
                    f'\n "files": [\n{lines}\n ]}}\n')


_took: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """With RECORD_ENV set, the seconds of each test's setup, call and teardown, by file (in
    the process that runs the session: xdist's workers report to it)."""
    if os.environ.get(RECORD_ENV) and not os.environ.get("PYTEST_XDIST_WORKER"):
        name = Path(report.nodeid.split("::")[0]).name
        _took[name] = _took.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(RECORD_ENV)
    if path and _took and not os.environ.get("PYTEST_XDIST_WORKER"):
        import datetime
        import platform

        workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(
            session.config.option, "numprocesses", None) or 1
        recorded = (f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
                    f"{len(os.sched_getaffinity(0))} cores, {workers} worker(s), exit "
                    f"{int(exitstatus)}")
        write_durations(Path(path), _took, recorded)


def pytest_configure(config):
    """Under parallel workers (`make test`), torch in each worker and every process it starts
    use the worker's share of the cores: two workers of two torch threads each on two cores
    would spend their time waiting for each other's threads. Set before torch is imported (not
    numpy, imported above; its thread pool does not matter here). A caller's value is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))
    _fixed_precision_probe(config)
    _own_cache(config)


# What the suite's `precision: auto` reads on a CPU with native bf16 (rul.training.cpu_probe's
# cache, in this and every process the tests start): fixed figures, bf16 the faster as the flag
# alone used to decide, so no test measures and none depends on the machine's load.
PROBED = {"fp32": 10000.0, "bf16": 15000.0}


def _fixed_precision_probe(config) -> None:
    import json
    import shutil
    import tempfile

    from rul.plan import recipe_step
    from rul.training.cpu_probe import cache_key

    folder = tempfile.mkdtemp(prefix="rul-precision-")
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    path = Path(folder) / "precision.json"
    path.write_text(json.dumps({cache_key(recipe_step()): {**PROBED, "load": 0, "cores": 1}}))
    os.environ["RUL_PRECISION_CACHE"] = str(path)


def _own_cache(config) -> None:
    """rul's user cache (rul.files.cache_folder: ONNX graphs traced once) in a folder of this
    run's own, made by the first pytest process and inherited by its workers and every process
    they start: the suite writes nothing into the user's cache, and what one test traced the
    others read."""
    import shutil
    import tempfile

    from rul.files import USER_CACHE_ENV

    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(USER_CACHE_ENV):
        return
    folder = tempfile.mkdtemp(prefix="rul-user-cache-")
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    os.environ[USER_CACHE_ENV] = folder


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(longest_first())}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order in a file


@contextlib.contextmanager
def _tracking_uri_kept():
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(autouse=True, scope="module")
def _tracking_uri_ends_with_its_module():
    """rul's store.configure sets MLFLOW_TRACKING_URI for the process (its subprocesses read
    it); a module fixture that trains in this process must not hand its store to the next
    module's tests, which may rely on the default ./mlflow.db."""
    with _tracking_uri_kept():
        yield


@pytest.fixture(autouse=True)
def _tracking_uri_ends_with_its_test():
    """The same for each test."""
    with _tracking_uri_kept():
        yield


@pytest.fixture(autouse=True)
def _deterministic_mode_ends_with_its_test():
    """A run with `deterministic: true` switches torch's deterministic algorithms on for the
    whole process; later tests must not inherit it (it fills every new tensor, for one)."""
    import torch

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)



@pytest.fixture(autouse=True)
def _signals_end_with_their_test():
    """rul interrupted in this process leaves SIGINT and SIGTERM ignored (rul.interrupts: once
    interrupted, a process is on its way out), and an ignored signal stays ignored across exec:
    a later test's processes would ignore them too (a worker watching its parent sends itself
    SIGTERM). Each test ends with the handlers it began with."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        if handler is not None:
            signal.signal(s, handler)


# Default synthetic layout: train units run to failure, test units are cut off earlier
# (unit 3 of the test file is shorter than the usual 30-cycle window on purpose).
TRAIN_LENGTHS = (52, 60, 35, 47, 41)
TEST_LENGTHS = (31, 45, 22, 38)

# Operating conditions of FD002/FD004 (setting_1, setting_2, setting_3), as in the real data.
CONDITIONS = np.array(
    [
        [0.0, 0.0, 100.0],
        [10.0, 0.25, 100.0],
        [20.0, 0.70, 100.0],
        [25.0, 0.62, 60.0],
        [35.0, 0.84, 100.0],
        [42.0, 0.84, 100.0],
    ]
)


def synthetic_frame(lengths, seed: int = 0, first_unit: int = 1, conditions=None) -> pd.DataFrame:
    """A typed C-MAPSS frame: `lengths[i]` cycles for unit `first_unit + i`.

    Informative sensors drift with wear (a quadratic trend towards the end of life) plus noise;
    the other sensors are exactly constant, as s_1, s_5, ... nearly are in FD001. With
    `conditions` (an array of condition indices per row, or an int count to draw them), settings
    take the FD002 triplets and each condition adds a large, different offset to every sensor.
    """
    rng = np.random.default_rng(seed)
    n_rows = int(sum(lengths))
    unit = np.repeat(np.arange(first_unit, first_unit + len(lengths)), lengths)
    cycle = np.concatenate([np.arange(1, n + 1) for n in lengths])
    wear = np.concatenate([(np.arange(1, n + 1) / n) ** 2 for n in lengths])

    sensors = np.tile(500.0 + 10.0 * np.arange(len(SENSOR_COLUMNS)), (n_rows, 1))
    informative = [SENSOR_COLUMNS.index(c) for c in INFORMATIVE_SENSORS]
    direction = np.where(np.arange(len(informative)) % 2 == 0, 1.0, -1.0)
    sensors[:, informative] += 5.0 * wear[:, None] * direction + rng.normal(
        0.0, 0.5, (n_rows, len(informative))
    )
    if conditions is None:
        settings = np.column_stack(
            [rng.normal(0.0, 0.002, n_rows), rng.normal(0.0, 0.0003, n_rows),
             np.full(n_rows, 100.0)]
        )
    else:
        if np.isscalar(conditions):
            conditions = rng.integers(0, int(conditions), n_rows)
        conditions = np.asarray(conditions)
        settings = CONDITIONS[conditions] + rng.normal(0.0, 1e-3, (n_rows, 3)) * [1, 0.1, 0]
        offsets = 1000.0 * (np.arange(len(CONDITIONS))[:, None] + 1) * (
            1.0 + np.arange(len(SENSOR_COLUMNS))[None, :] % 3
        )
        sensors = sensors + offsets[conditions]
    frame = pd.DataFrame(np.column_stack([settings, sensors]),
                         columns=SETTING_COLUMNS + SENSOR_COLUMNS)
    frame.insert(0, "cycle", cycle.astype(np.int64))
    frame.insert(0, "unit", unit.astype(np.int64))
    assert list(frame.columns) == COLUMNS
    return frame


def unwarned(text: str) -> list[str]:
    """The lines a command printed, less its `warning: ` lines (a tiny data set's few test or
    validation engines are said before anything else): what a test of its one line reads."""
    return [line for line in text.strip().splitlines() if not line.startswith("warning: ")]


def frame_to_text(frame: pd.DataFrame) -> str:
    """Format a frame like the C-MAPSS files (ints for unit/cycle, trailing space per line)."""
    lines = []
    for row in frame.itertuples(index=False):
        values = [str(int(row[0])), str(int(row[1]))] + [f"{v:.4f}" for v in row[2:]]
        lines.append(" ".join(values) + " ")
    return "\n".join(lines) + "\n"


def rewrite_line(path: Path, number: int, change: "str | Callable[[list[str]], object]") -> str:
    """Replace line `number` (1-based) of `path`; return the new line.

    `change` is either the new line's text, or a function given the line's tokens (a list it
    may edit in place, or return a new list/str from).
    """
    lines = Path(path).read_text().splitlines()
    if isinstance(change, str):
        new = change
    else:
        tokens = lines[number - 1].split()
        result = change(tokens)
        result = tokens if result is None else result
        new = result if isinstance(result, str) else " ".join(result)
    lines[number - 1] = new
    Path(path).write_text("\n".join(lines) + "\n")
    return new


def fit_plan(config, train, val, seeds=None, precision=None, **fields):
    """The RunPlan that rul.training.engine.fit executes for `config` on the `train` and `val`
    WindowSets, on the CPU: `config`'s seeds and precision unless given; `fields` are the
    plan's others (world, resume)."""
    import torch

    from rul.plan import RunPlan, cpu_measured
    from rul.training.precision import resolve_precision
    from rul.training.seeding import derive_seeds

    precision = precision or resolve_precision(config.precision, torch.device("cpu"),
                                               config.model, probe=cpu_measured)
    data = SimpleNamespace(train=train, val=val)
    return RunPlan.of(config, precision, seeds or derive_seeds(config.seed), data, **fields)


@pytest.fixture(scope="session")
def real_data_dir() -> Path:
    """The real C-MAPSS folder from $CMAPSS_DIR; skipped when absent, but a failure on CI."""
    value = os.environ.get("CMAPSS_DIR")
    if value and (Path(value) / "train_FD001.txt").is_file():
        return Path(value)
    reason = (
        f"real C-MAPSS data not found (CMAPSS_DIR={value!r} lacks train_FD001.txt); "
        "set CMAPSS_DIR to a folder with the FD001 files"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def fd001(real_data_dir):
    """The real FD001 subset, loaded once per session."""
    from rul.data import load_subset

    return load_subset("FD001", real_data_dir)


@pytest.fixture(scope="session")
def make_frame() -> Callable[..., pd.DataFrame]:
    """Factory for typed synthetic frames, see `synthetic_frame`."""
    return synthetic_frame


@pytest.fixture
def write_cmapss(tmp_path) -> Callable[..., Path]:
    """Factory writing a small valid C-MAPSS subset; returns the folder.

    write_cmapss(directory=None, *, subset="FD001", train_lengths=TRAIN_LENGTHS,
                 test_lengths=TEST_LENGTHS, rul=None, seed=0)

    Files: train_<subset>.txt, test_<subset>.txt, RUL_<subset>.txt (one RUL per test unit,
    default 10, 17, 24, ...). Corrupt a line afterwards with the `rewrite_line` fixture.
    """

    def write(directory=None, *, subset="FD001", train_lengths=TRAIN_LENGTHS,
              test_lengths=TEST_LENGTHS, rul=None, seed=0) -> Path:
        directory = Path(directory) if directory is not None else tmp_path / "cmapss"
        directory.mkdir(parents=True, exist_ok=True)
        train = synthetic_frame(train_lengths, seed=seed)
        test = synthetic_frame(test_lengths, seed=seed + 1)
        if rul is None:
            rul = [10 + 7 * i for i in range(len(test_lengths))]
        (directory / f"train_{subset}.txt").write_text(frame_to_text(train))
        (directory / f"test_{subset}.txt").write_text(frame_to_text(test))
        (directory / f"RUL_{subset}.txt").write_text("".join(f"{v} \n" for v in rul))
        return directory

    return write


@pytest.fixture
def rewrite() -> Callable[..., str]:
    """`rewrite(path, line_number, new_text_or_function)`, see `rewrite_line`."""
    return rewrite_line


@contextlib.contextmanager
def fresh_mlflow_store(root: Path) -> Iterator[SimpleNamespace]:
    """Work inside `root` with MLFLOW_TRACKING_URI unset (MLflow's default store: ./mlflow.db
    and ./mlruns there); afterwards restore the working directory, the environment and
    MLflow's global tracking URI, which `rul.tracking.store.configure` sets (env var too).

    Yields `root` and `uri`, the sqlite URI of the store's mlflow.db."""
    import mlflow

    root = Path(root)
    patch = pytest.MonkeyPatch()
    patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # restored on undo
    patch.chdir(root)
    try:
        yield SimpleNamespace(root=root, uri=f"sqlite:///{root}/mlflow.db")
    finally:
        mlflow.set_tracking_uri(None)
        patch.undo()


@pytest.fixture(scope="session")
def mlflow_store_at() -> Callable[[Path], contextlib.AbstractContextManager[SimpleNamespace]]:
    """`with mlflow_store_at(folder) as store:` a fresh MLflow store, see `fresh_mlflow_store`."""
    return fresh_mlflow_store


@pytest.fixture
def mlflow_store(tmp_path) -> Iterator[SimpleNamespace]:
    """A fresh MLflow store in `tmp_path`, the working directory for the test."""
    with fresh_mlflow_store(tmp_path) as store:
        yield store


# ------------------------------------------------------------------ tools and servers

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str):
    """tools/<name>.py as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until_answering(process, url: str, log_path: Path, seconds: float) -> None:
    """Poll `url` until it answers 200; fail with the log's end if `process` exits first, or
    after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, Path(log_path).read_text()[-3000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        assert time.monotonic() < deadline, f"{url} did not answer within {seconds} s"
        time.sleep(1)


# ------------------------------------------------------------------ make ui

UI_START_S = 180  # `mlflow ui` migrates a new store and starts workers: slow on 2 cores
UI_STOP_S = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sigint_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def serve_mlflow_ui(store, started: list, stopped: dict | None = None) -> Iterator[str]:
    """`make ui`'s command (python -m rul.tracking.ui) over `store` on a free port (its output
    in `store.root / "ui.log"`); yields its base URL, then stops it as Ctrl-C does (SIGINT).
    It starts with SIGINT ignored, as a background job of a non-interactive shell (some CI
    runners) starts: Ctrl-C must stop it all the same. `started` gets the processes it ran,
    found just before the stop; `stopped`, when given, the seconds from Ctrl-C until it and
    every process it started were gone (`seconds`) and its exit code (`returncode`). A UI
    that does not stop within UI_STOP_S, or leaves a process running, is killed with its
    tree and fails the test."""
    port = _free_port()
    log_path = store.root / "ui.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "rul.tracking.ui", "--backend-store-uri", store.uri,
             "--port", str(port), "--host", "127.0.0.1"],
            cwd=store.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_sigint_ignored)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until_answering(server, f"{base}/health", log_path, UI_START_S)
            yield base
        finally:
            if server.poll() is None:
                started.extend((p, " ".join(p.cmdline()))  # the job consumers start late
                               for p in psutil.Process(server.pid).children(recursive=True))
                signalled = time.monotonic()
                server.send_signal(signal.SIGINT)  # Ctrl-C
                try:
                    server.wait(timeout=UI_STOP_S)
                    psutil.wait_procs([p for p, _ in started], timeout=UI_STOP_S)
                    if stopped is not None:
                        stopped.update(seconds=time.monotonic() - signalled,
                                       returncode=server.returncode)
                except subprocess.TimeoutExpired:  # leave nothing behind, then fail below
                    for process, _ in [*started, (psutil.Process(server.pid), "")]:
                        with contextlib.suppress(psutil.NoSuchProcess):
                            process.kill()
                    server.wait()
                    raise AssertionError(
                        f"the UI did not stop within {UI_STOP_S} s of Ctrl-C") from None
                left = [(p, command) for p, command in started
                        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
                for process, _ in left:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
                assert not left, f"processes the UI started outlived it: {left}"


@pytest.fixture(scope="session")
def mlflow_ui() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """`with mlflow_ui(store, started) as base_url:` see `serve_mlflow_ui`."""
    return serve_mlflow_ui


# ------------------------------------------------------------------ tiny trainings on FD001

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "fd001.yaml"
# The default config shrunk to a few seconds of training on the real FD001 data.
TINY_TRAINING = {"epochs": 2, "filters": 4, "num_layers": 2, "hidden_size": 16,
                 "micro_batch_size": 1024, "accumulation_steps": 1, "patience": 5}


@pytest.fixture(scope="module")
def fd001_store(request, tmp_path_factory, real_data_dir) -> Iterator[SimpleNamespace]:
    """One test module's fresh MLflow store on the real FD001 data: `.config(**changes)` is the
    default config made tiny (TINY_TRAINING), tracked and checkpointed in it."""
    from rul import config as cfg

    folder = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    with fresh_mlflow_store(folder) as fresh:
        def config(**changes):
            return cfg.load(DEFAULT_CONFIG, {**TINY_TRAINING, "tracking_uri": fresh.uri,
                                             "checkpoint_dir": str(fresh.root / "ckpt"),
                                             "data_dir": str(real_data_dir), **changes})

        yield SimpleNamespace(root=fresh.root, uri=fresh.uri, data_dir=Path(real_data_dir),
                              config=config)


@pytest.fixture(scope="module")
def fd001_client(fd001_store):
    """An MlflowClient on `fd001_store`."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=fd001_store.uri)


# ---------------------------------------------------------------- PostgreSQL


def unavailable(reason: str):
    """Skip for `reason`, but fail on CI (CI=true), which installs what the test needs."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must run this test: .ci/run installs it)")
    pytest.skip(reason)


def postgres_bin() -> Path | None:
    import glob

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


@contextlib.contextmanager
def postgres_cluster(database: str = "rul_test", *more: str) -> Iterator[str]:
    """postgresql://postgres@127.0.0.1:PORT/<database> on a throwaway cluster (initdb into a
    temporary folder, run as the postgres user when we are root; trust authentication, so a
    URL may carry any password), with the databases `more` beside it, stopped and removed
    afterwards."""
    import shutil
    import tempfile

    bindir = postgres_bin()
    if bindir is None:
        unavailable("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb; "
                    "apt-get install postgresql)")
    if importlib.util.find_spec("psycopg2") is None:
        unavailable("the PostgreSQL driver psycopg2 is not installed (pip install '.[postgres]')")
    root = Path(tempfile.mkdtemp(prefix="rul-pg-"))  # not under pytest's 0700 tmp folder
    as_postgres = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(root, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()

    def pg(*args, **kwargs):
        return subprocess.run([*as_postgres, *map(str, args)], check=True,
                              capture_output=True, text=True, timeout=120, **kwargs)

    started = False
    try:
        pg(bindir / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
           "--no-sync")
        pg(bindir / "pg_ctl", "-D", data, "-l", root / "server.log", "-w", "start", "-o",
           f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
           "-c max_connections=200")
        started = True
        for name in (database, *more):
            pg(bindir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", name)
        yield f"postgresql://postgres@127.0.0.1:{port}/{database}"
    except subprocess.CalledProcessError as error:
        pytest.fail(f"could not start PostgreSQL: {error.cmd}: {error.stderr}")
    finally:
        if started:
            pg(bindir / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def pg_dump(url: str) -> str:
    """The whole database of `url` as SQL (its data included), from Debian's pg_dump."""
    bindir = postgres_bin()
    plain = url.replace("postgresql+psycopg2://", "postgresql://")
    return subprocess.run([str(bindir / "pg_dump"), plain], check=True, capture_output=True,
                          text=True, timeout=120).stdout

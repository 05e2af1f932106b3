"""Secrets never leave the URL they came in: a password (or a secret query parameter) in the
tracking URI, the Optuna storage or the MLflow server's backend is masked in every printed
line, run param, tag, logged-model param and error, and nothing of it reaches the store.

The PostgreSQL part runs rul against a throwaway server (conftest.postgres_cluster) with a
password in its URLs, then searches every output, the whole PostgreSQL database (pg_dump),
the SQLite store and the artifact folder for the secret.
"""

import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner
from conftest import pg_dump, postgres_cluster, unwarned

from rul import config as cfg
from rul.cli import UserError, browse_hint, main
from rul.tracking import ui
from rul.tracking.run_params import config_params
from rul.urls import masked, remember, scrubbed, secrets_of, with_driver

SECRET = "S3cretPW-7f2c"
TINY = ["epochs=1", "patience=5", "window=20", "filters=4", "num_layers=2", "hidden_size=8",
        "micro_batch_size=64", "accumulation_steps=1"]


# ---------------------------------------------------------------- what is secret


@pytest.mark.parametrize("url, shown", [
    (f"postgresql://alice:{SECRET}@db:5432/mlflow", "postgresql://alice:***@db:5432/mlflow"),
    (f"postgresql+psycopg2://alice:{SECRET}@db/mlflow", "postgresql+psycopg2://alice:***@db/mlflow"),
    (f"postgresql://alice@db/x?password={SECRET}&sslmode=require",
     "postgresql://alice@db/x?password=***&sslmode=require"),
    (f"https://u:{SECRET}@mlflow.example:5000/", "https://u:***@mlflow.example:5000/"),
    (f"https://mlflow.example/?token={SECRET}&a=1", "https://mlflow.example/?token=***&a=1"),
    (f"mysql+pymysql://root:p@ss{SECRET}@h/db", "mysql+pymysql://root:***@h/db"),
    ("postgresql://alice@db/mlflow", "postgresql://alice@db/mlflow"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("optuna.journal", "optuna.journal"),
])
def test_one_helper_decides_what_is_secret_in_a_url(url, shown):
    assert masked(url) == shown
    assert all(secret not in shown for secret in secrets_of(url))


def test_a_secret_is_masked_in_any_text_as_written_or_percent_encoded():
    url = "postgresql://alice:p%40ss-word@db/x"
    assert "p@ss-word" in secrets_of(url) and "p%40ss-word" in secrets_of(url)
    said = "connect to postgresql://alice:p%40ss-word@db/x failed (password p@ss-word)"
    assert scrubbed(said, url) == "connect to postgresql://alice:***@db/x failed (password ***)"


def test_every_postgresql_url_rul_hands_on_gets_the_installed_driver():
    assert with_driver("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert with_driver("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    from rul.tracking.ui import with_backend_driver
    from rul.tracking_uri import for_mlflow

    assert for_mlflow("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert with_backend_driver(["--backend-store-uri", "postgresql://u@h/db", "--port", "1"]) \
        == ["--backend-store-uri", "postgresql+psycopg2://u@h/db", "--port", "1"]
    assert with_backend_driver(["--backend-store-uri=postgresql://u@h/db"]) \
        == ["--backend-store-uri=postgresql+psycopg2://u@h/db"]


def test_params_the_browse_line_and_errors_show_the_url_masked():
    url = f"postgresql://alice:{SECRET}@db.example/mlflow"
    config = cfg.load(None, [f"tracking_uri={url}"])
    params = config_params(config)
    assert params["tracking_uri"] == "postgresql://alice:***@db.example/mlflow"
    assert SECRET not in str(params)
    line = browse_hint(url, "1")
    assert SECRET not in line and "alice:***@db.example" in line
    assert "the password masked" in line
    remember(url)
    assert SECRET not in UserError(f"store {url} refused: password {SECRET}").message


def test_a_traceback_and_a_warning_show_the_secret_masked(tmp_path):
    url = f"postgresql://alice:{SECRET}@db.example/mlflow"
    script = (f"import warnings\nfrom rul.console import masked_tracebacks, one_line_warnings\n"
              f"from rul.urls import remember\nremember({url!r})\none_line_warnings()\n"
              f"masked_tracebacks()\nwarnings.warn('engine at {url}')\n"
              f"raise RuntimeError('could not connect to {url}')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert SECRET not in done.stderr
    assert "warning: engine at postgresql://alice:***@db.example/mlflow" in done.stderr
    assert "RuntimeError: could not connect to postgresql://alice:***@db.example" in done.stderr


# Every shape of secret a URL carries, each in a URL nothing answers at (port 1).
SHAPES = {
    "a password with a slash": f"postgresql://alice:pa/ss-{SECRET}@127.0.0.1:1/mlflow",
    "http user info": f"http://alice:{SECRET}@127.0.0.1:1/",
    "an access token": f"http://127.0.0.1:1/?access_token={SECRET}",
    "a token beside another parameter": f"https://127.0.0.1:1/mlflow?token={SECRET}&x=1",
}


@pytest.mark.parametrize("url", SHAPES.values(), ids=SHAPES.keys())
def test_each_shape_of_secret_is_masked_on_every_printing_path(url, write_cmapss, tmp_path,
                                                               capsys):
    """A training on a store that does not answer (its retry lines and its last line), the
    `browse:` line, the run params, an error naming the URL, a warning quoting it: none shows
    the secret, in any spelling (as written, percent-encoded)."""
    from rul.console import show_warning

    said = [browse_hint(url, "1"), str(config_params(cfg.load(None, [f"tracking_uri={url}"]))),
            UserError(f"store {url} refused").message, masked(url)]
    show_warning(UserWarning(f"engine at {url}"), UserWarning, "x.py", 1)
    said.append(capsys.readouterr().err)
    trained = run_rul(["train", *TINY, f"data_dir={write_cmapss()}", f"tracking_uri={url}",
                       "--no-progress"], tmp_path, env={"RUL_CONNECT_TIMEOUT": "1.5"})
    assert trained.exit_code == 69, trained.output
    assert "retrying in 1 s" in trained.stderr  # a retry line was printed
    said.append(trained.output)
    spellings = {SECRET, f"pa/ss-{SECRET}", f"pa%2Fss-{SECRET}"}
    assert [line for line in "\n".join(said).splitlines()
            if any(spelled in line for spelled in spellings)] == []
    assert "***" in said[0] and "***" in trained.stderr


def test_a_tracking_server_s_token_stays_in_the_query_it_came_in(monkeypatch):
    """The health probe of an http store with a token adds /health to the path, not to the
    token's value (which the server would then refuse)."""
    import requests

    from rul.services import wait_for_http

    asked = []
    monkeypatch.setattr(requests, "get", lambda url, timeout: asked.append(url))
    wait_for_http(f"https://127.0.0.1:1/mlflow/?access_token={SECRET}&x=1", "the store")
    assert asked == [f"https://127.0.0.1:1/mlflow/health?access_token={SECRET}&x=1"]


def test_a_file_s_secret_quoted_in_an_error_is_masked(tmp_path):
    """A data table that is a .env file by mistake: the error lists its header (the file's
    first line) as the columns it found, NAME=value masked where the name says secret."""
    table = tmp_path / "engines.csv"
    table.write_text(f"MLFLOW_TRACKING_PASSWORD={SECRET}\n1\n")
    config = Path(__file__).resolve().parents[1] / "experiments" / "fleet.yaml"
    (tmp_path / "fleet.yaml").write_text(config.read_text().replace(
        "fleet/engines.parquet", str(table)))
    done = run_rul(["train", str(tmp_path / "fleet.yaml")], tmp_path)
    assert done.exit_code == 2
    assert done.stderr == (f"Error: {table}: data.unit: no column 'engine_id' (columns: "
                           "MLFLOW_TRACKING_PASSWORD=***)\n")


# ---------------------------------------------------------------- against a real PostgreSQL


@pytest.fixture(scope="module")
def postgres():
    with postgres_cluster("rul_secrets", "rul_study") as url:
        # trust auth: any password, one with a slash (a URL takes it as written)
        yield url.replace("postgres@", f"postgres:pa/ss-{SECRET}@")


def run_rul(args: list[str], cwd: Path, env: dict | None = None):
    """`rul ARGS` in this process (CliRunner: stdout and stderr apart), from `cwd`."""
    patch = pytest.MonkeyPatch()
    patch.chdir(cwd)
    patch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for key, value in (env or {}).items():
        patch.setenv(key, value)
    try:
        return CliRunner().invoke(main, args)
    finally:
        mlflow.set_tracking_uri(None)
        patch.undo()


def files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_no_output_and_no_store_holds_the_secret(postgres, write_cmapss, tmp_path, monkeypatch,
                                                 capsys):
    """`rul train` tracking to PostgreSQL (`postgresql://`, no driver named), `rul predict`
    from it, `rul tune` with its study on PostgreSQL and its runs in SQLite, a refused
    database and `make server`'s check: every line they print, the PostgreSQL database, the
    SQLite store and the artifacts, searched for the secret."""
    data = write_cmapss()
    work = tmp_path / "work"
    work.mkdir()
    base = [*TINY, f"data_dir={data}", "checkpoint_dir=ckpt"]
    outputs = []

    trained = run_rul(["train", *base, f"tracking_uri={postgres}", "--no-progress"], work)
    outputs.append(trained.stdout + trained.stderr)
    assert trained.exit_code == 0, trained.stderr[-3000:]
    assert "postgres:***@127.0.0.1" in trained.stdout  # the browse line, masked

    predicted = run_rul(["predict", "--model", "models:/rul-fd001@champion", "--input",
                         str(data / "test_FD001.txt"), "--tracking-uri", postgres], work)
    outputs.append(predicted.stdout + predicted.stderr)
    assert predicted.exit_code == 0, predicted.stderr[-3000:]

    tune_config = Path(__file__).resolve().parents[1] / "experiments" / "tune_fd001.yaml"
    tuned = run_rul(["tune", str(tune_config), *base, "baseline_trial=false",
                     "search_space={lr: {type: float, low: 0.001, high: 0.002}}",
                     "--n-trials", "1", "--storage", postgres.replace("rul_secrets", "rul_study")],
                    work)
    outputs.append(tuned.stdout + tuned.stderr)
    assert tuned.exit_code == 0, tuned.stderr[-3000:]

    missing = postgres.rsplit("/", 1)[0] + "/no_such_database"
    refused = run_rul(["train", *base, f"tracking_uri={missing}"], work,
                      env={"RUL_CONNECT_TIMEOUT": "0"})
    outputs.append(refused.stdout + refused.stderr)
    assert refused.exit_code == 2 and len(unwarned(refused.stderr)) == 1, refused.stderr
    assert "postgres:***@127.0.0.1" in refused.stderr

    monkeypatch.setenv("RUL_CONNECT_TIMEOUT", "0")
    assert ui.main(["server", "--backend-store-uri", missing]) == 2  # `make server`'s check
    server = capsys.readouterr()
    driver = postgres.replace("postgresql:", "postgresql+psycopg2:")  # one database, however
    shared = run_rul(["tune", str(tune_config), *base, "baseline_trial=false", "--storage",
                      postgres], work,  # spelled
                     env={"MLFLOW_TRACKING_URI": driver})
    outputs.append(shared.stdout + shared.stderr)
    assert shared.exit_code == 2 and "the tracking store's database" in shared.stderr
    outputs.append(server.out + server.err)
    assert "does not exist" in server.err and "postgres:***@127.0.0.1" in server.err

    assert [SECRET in said for said in outputs] == [False] * len(outputs)
    dump = pg_dump(postgres.replace("pa/ss", "pa%2Fss"))  # libpq's spelling
    assert "rul-fd001" in dump and "tracking_uri" in dump  # the runs are there, masked
    assert SECRET not in dump
    study = pg_dump(postgres.replace("rul_secrets", "rul_study").replace("pa/ss", "pa%2Fss"))
    assert "rul-fd001-tune" in study and SECRET not in study
    assert (work / "mlflow.db").is_file()  # the study's runs
    assert files_holding(work, SECRET) == []  # the SQLite store, mlruns, checkpoints

"""Servers that do not answer (PostgreSQL for a study, an MLflow tracking server): retried for
a bounded time (RUL_CONNECT_TIMEOUT) with a countdown on stderr, then one line and exit 69;
nothing is started. A free local port with nothing listening stands for the server."""

import io
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rul import services
from rul.cli import main
from rul.config import ConfigError
from rul.services import ServiceUnavailable, wait_for

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """Work in an empty folder, waiting 1.5 s for servers; the address of a closed port."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(services.TIMEOUT_ENV, "1.5")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return f"127.0.0.1:{free_port()}"


def assert_unreachable(result, started: float, what: str, tmp_path: Path) -> None:
    assert result.exit_code == services.EXIT_CODE, result.output
    *countdown, last = result.stderr.splitlines()
    assert last.startswith(f"Error: {what} is not reachable (connection refused) after 1.5 s; ")
    assert countdown and all(f"{what} is not reachable (connection refused); retrying in "
                             in line for line in countdown)
    assert "Traceback" not in result.output
    assert 1.5 <= time.monotonic() - started < 15
    assert list(tmp_path.iterdir()) == []  # no store, no study, no run


def test_tune_on_a_postgresql_server_that_does_not_answer(nowhere, tmp_path):
    storage = f"postgresql://rul:secret@{nowhere}/rul"
    started = time.monotonic()
    result = CliRunner().invoke(main, ["tune", str(ROOT / "experiments" / "tune_fd001.yaml"),
                                       "--storage", storage])
    assert_unreachable(result, started, f"--storage postgresql://rul:***@{nowhere}/rul",
                       tmp_path)
    assert "secret" not in result.output


@pytest.mark.parametrize("command", ["tune", "train"])
def test_a_database_url_without_its_driver_is_one_line_naming_the_install(nowhere, tmp_path,
                                                                         monkeypatch, command):
    """psycopg2 comes with the `postgres` extra; without it, one line says so (no traceback,
    no wait for the server, nothing created)."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "psycopg2" else found(name, *a))
    url = f"postgresql://rul:secret@{nowhere}/rul"
    args = (["tune", str(ROOT / "experiments" / "tune_fd001.yaml"), "--storage", url]
            if command == "tune" else ["train", "epochs=1", f"tracking_uri={url}"])
    started = time.monotonic()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "its driver psycopg2 is not installed: pip install 'rul[postgres]'"), lines
    assert "secret" not in result.output and time.monotonic() - started < 10
    assert list(tmp_path.iterdir()) == []


def test_train_on_a_tracking_server_that_does_not_answer(nowhere, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://{nowhere}")
    started = time.monotonic()
    result = CliRunner().invoke(main, ["train", "epochs=1"])
    assert_unreachable(result, started, f"MLflow tracking server http://{nowhere}", tmp_path)


def test_predict_from_a_tracking_server_that_does_not_answer(nowhere, tmp_path):
    from conftest import frame_to_text, synthetic_frame

    rows = tmp_path.parent / f"{tmp_path.name}-rows.txt"  # the input, outside the work folder
    rows.write_text(frame_to_text(synthetic_frame((31, 40))))
    started = time.monotonic()
    result = CliRunner().invoke(main, ["predict", "--model", "models:/rul-fd001@champion",
                                       "--input", str(rows), "--tracking-uri",
                                       f"http://{nowhere}"])
    assert_unreachable(result, started, f"MLflow tracking server http://{nowhere}", tmp_path)


# ---------------------------------------------------------------- the waiting itself


def flaky(failures: int):
    calls = []

    def attempt():
        calls.append(time.monotonic())
        if len(calls) <= failures:
            raise ConnectionRefusedError("refused")

    return attempt, calls


def down(error):
    return "connection refused" if isinstance(error, ConnectionRefusedError) else None


def test_a_server_that_comes_up_while_we_wait_is_used(monkeypatch):
    monkeypatch.setattr(services, "DELAYS", (0.1,))
    attempt, calls = flaky(2)
    said = io.StringIO()
    wait_for("the server", attempt, down, "start it", seconds=5, stream=said)
    assert len(calls) == 3
    assert said.getvalue().splitlines() == [
        "the server is not reachable (connection refused); retrying in 0 s, giving up in 5 s"
    ] * 2


def test_the_wait_is_bounded_and_ends_in_one_line(monkeypatch):
    monkeypatch.setattr(services, "DELAYS", (0.2,))
    attempt, calls = flaky(1000)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as error:
        wait_for("the server", attempt, down, "start it", seconds=1, stream=io.StringIO())
    assert 1 <= time.monotonic() - started < 1.5 and 5 <= len(calls) <= 7
    assert str(error.value) == ("the server is not reachable (connection refused) after 1 s; "
                                "start it")
    with pytest.raises(ServiceUnavailable):  # 0: one attempt, no wait
        wait_for("the server", flaky(1)[0], down, "start it", seconds=0, stream=io.StringIO())


def test_other_errors_are_not_retried():
    def attempt():
        raise PermissionError("no")

    with pytest.raises(PermissionError):
        wait_for("the server", attempt, down, "start it", seconds=5, stream=io.StringIO())


def test_on_a_terminal_one_line_counts_down_in_place(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(services, "DELAYS", (1.2,))
    screen = Terminal()
    wait_for("the server", flaky(1)[0], down, "start it", seconds=5, stream=screen)
    shown = screen.getvalue()
    assert shown.count("\n") == 1 and shown.endswith("\n")  # one line, closed when done
    frames = shown.removesuffix("\n").split("\r")[1:]
    assert [f.removesuffix(" s\x1b[K")[-3:] for f in frames] == ["  5", "  4"]  # each second
    assert frames[0].startswith("the server is not reachable (connection refused); retrying, "
                                "giving up in")


@pytest.mark.parametrize("value", ["soon", "-1", "inf"])
def test_a_bad_timeout_is_a_one_line_error(monkeypatch, value):
    monkeypatch.setenv(services.TIMEOUT_ENV, value)
    with pytest.raises(ConfigError, match=f"^RUL_CONNECT_TIMEOUT='{value}': must be a number"):
        services.timeout()

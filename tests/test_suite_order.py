"""The suite's own order and time: the files run longest first as tests/durations.json records
them, `make test-durations` records them again, and every test target ends with its 15 slowest
tests."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_files_run_in_the_recorded_order_unlisted_ones_last():
    order = conftest.longest_first()
    seconds = [row["seconds"] for row in json.loads(conftest.DURATIONS.read_text())["files"]]
    assert len(order) > 2 and seconds == sorted(seconds, reverse=True)  # the longest first
    assert len(order) == len(set(order)) and all((ROOT / "tests" / n).is_file() for n in order)
    items = [SimpleNamespace(path=ROOT / "tests" / name)
             for name in ("test_new.py", order[2], order[0], "test_new.py", order[1])]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.path.name for item in items] == [*order[:3], "test_new.py", "test_new.py"]


def test_a_record_is_longest_first_and_keeps_the_files_that_did_not_run(tmp_path):
    record = tmp_path / "durations.json"
    conftest.write_durations(record, {"test_a.py": 3.0, "test_b.py": 40.04}, "first")
    conftest.write_durations(record, {"test_c.py": 7.0, "test_a.py": 1.0}, "second")
    assert conftest.longest_first(record) == ["test_c.py", "test_a.py", "test_b.py"]
    written = json.loads(record.read_text())
    assert written["recorded"] == "second" and written["command"] == "make test-durations"
    assert written["files"][2] == {"file": "test_b.py", "seconds": 40.0}


@pytest.mark.slow  # a pytest session of two workers: half a minute
def test_a_parallel_run_records_each_files_seconds(tmp_path):
    record = tmp_path / "durations.json"
    shutil.copy2(conftest.DURATIONS, record)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")},
           conftest.RECORD_ENV: str(record)}  # run from a worker: the inner run's own session
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "2", "--dist", "loadfile", "tests/test_study_lock.py",
                           "tests/test_docs.py", "-k", "lock or short"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    rows = json.loads(record.read_text())["files"]
    ran = {row["file"]: row["seconds"] for row in rows[:2]}
    assert set(ran) == {"test_study_lock.py", "test_docs.py"} and all(ran.values())
    # the rest kept, in the record's order
    assert [row["file"] for row in rows[2:]] == [
        name for name in conftest.longest_first() if name not in ran]
    assert "2 worker(s)" in json.loads(record.read_text())["recorded"]


def test_every_test_target_shows_its_15_slowest_and_one_target_records(tmp_path):
    def recipe(target: str) -> str:
        return subprocess.run(["make", "-n", "-o", ".venv/.installed", target], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout

    for target in ("test", "test-e2e", "test-all"):
        assert "--durations=15" in recipe(target)
        assert "durations=15" in subprocess.run(
            ["make", "-n", "-o", ".venv/.installed", target, "TEST_JOBS=0"], cwd=ROOT,
            capture_output=True, text=True, check=True).stdout
    assert f"{conftest.RECORD_ENV}={ROOT / 'tests' / 'durations.json'}" in recipe(
        "test-durations")
    assert "make test-durations" in (ROOT / "Makefile").read_text()

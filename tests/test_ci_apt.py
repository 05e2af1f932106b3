""".ci/run's apt-get waits while another apt or dpkg process holds the lock (an unattended
upgrade on a fresh machine) instead of failing with exit 100. A fake apt-get on PATH refuses
with apt's own lock messages as many times as asked."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WAITING = ROOT / ".ci" / "apt-get-waiting"
LOCKED = ("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 2770 (apt-get)\n"
          "E: Unable to lock directory /var/lib/apt/lists/\n")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def fake_apt(tmp_path: Path, refusals: int, then: str = "", code: int = 0) -> Path:
    """An apt-get that refuses `refusals` times with the lock messages, then prints `then`
    on stderr and exits `code`; it logs its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/calls
n=$(wc -l < {tmp_path}/calls)
if [ "$n" -le {refusals} ]; then printf '{LOCKED}' >&2; exit 100; fi
printf '{then}' >&2
echo "done"
exit {code}
""")
    script.chmod(0o755)
    return bin_dir


def run(bin_dir: Path, *args: str, wait: str = "30") -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APT_LOCK_WAIT": wait,
           "APT_LOCK_POLL": "0.2"}
    return subprocess.run([str(WAITING), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_it_waits_for_the_lock_and_then_runs(tmp_path):
    result = run(fake_apt(tmp_path, refusals=3), "update", "-qq")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert calls(tmp_path) == ["-o DPkg::Lock::Timeout=30 update -qq"] * 4
    assert result.stderr.startswith(LOCKED)  # apt's words, once
    assert result.stderr.count("Could not get lock") == 1
    assert ("apt-get update -qq: another apt or dpkg process holds the lock (held by process "
            "2770 (apt-get)); waiting, giving up in ") in result.stderr


def test_another_failure_is_not_waited_for(tmp_path):
    result = run(fake_apt(tmp_path, refusals=0, then="E: Unable to locate package nope\\n",
                          code=100), "install", "-y", "nope")
    assert result.returncode == 100
    assert result.stderr == "E: Unable to locate package nope\n"
    assert len(calls(tmp_path)) == 1


def test_the_wait_is_bounded(tmp_path):
    started = time.monotonic()
    result = run(fake_apt(tmp_path, refusals=1000), "update", wait="1")
    assert result.returncode == 100
    assert time.monotonic() - started < 10
    assert result.stderr.endswith("apt-get update: the apt/dpkg lock was still held after 1 s "
                                  "(APT_LOCK_WAIT)\n")


def test_ci_run_installs_through_it():
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if not line.lstrip().startswith("#")]
    text = "\n".join(commands)
    assert "apt-get " not in text.replace(".ci/apt-get-waiting", "")
    assert text.count(".ci/apt-get-waiting update") == 2

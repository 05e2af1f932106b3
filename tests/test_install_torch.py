"""`make install` picks the torch build for the machine (tools/install_torch.sh): the CPU
index on Linux without an NVIDIA GPU, a line with the download's size when that index
cannot be reached, TORCH as given, and nothing where torch is already there or a GPU is.

The virtualenv's python is a stand-in that records its arguments: nothing is installed."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "install_torch.sh"
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  "-c import torch") [ -n "${HAS_TORCH:-}" ] && exit 0 || exit 1 ;;
  "-c import sys, urllib.request"*)
    [ -n "${REAL_PYTHON:-}" ] && exec "$REAL_PYTHON" "$@"
    [ -n "${INDEX_DOWN:-}" ] && exit 1 || exit 0 ;;
esac
exit 0
"""


def install(tmp_path, gpu=False, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    path = os.environ["PATH"]
    if gpu:
        bin_ = tmp_path / "gpu-bin"
        bin_.mkdir(exist_ok=True)
        (bin_ / "nvidia-smi").write_text("#!/bin/sh\n")
        (bin_ / "nvidia-smi").chmod(0o755)
        path = f"{bin_}{os.pathsep}{path}"
    calls = tmp_path / "calls"
    calls.unlink(missing_ok=True)
    done = subprocess.run(["sh", str(SCRIPT), str(python)], capture_output=True, text=True,
                          env={**os.environ, "PATH": path, "CALLS": str(calls),
                               "TORCH": "", **env}, timeout=30)
    return done, calls.read_text().splitlines() if calls.exists() else []


CPU_ONLY_LINUX = pytest.mark.skipif(shutil.which("nvidia-smi") is not None
                                    or Path("/proc/driver/nvidia/version").exists()
                                    or os.uname().sysname != "Linux",
                                    reason="needs Linux without NVIDIA GPU")


@CPU_ONLY_LINUX
def test_a_cpu_only_linux_machine_gets_the_cpu_build_or_a_line_with_the_size(tmp_path):
    done, calls = install(tmp_path, TORCH_CPU_INDEX="https://example.invalid/cpu")
    assert done.returncode == 0, done.stderr
    probe = calls[-2].split()  # the index asked once, with a short timeout, then pip
    assert probe[-2:] == ["https://example.invalid/cpu/torch/", "5"]
    assert calls[-1] == ("-m pip install -q --retries 0 --timeout 30 --index-url "
                         "https://example.invalid/cpu torch>=2.4,<=2.14.1")  # pyproject's pin
    assert "installing torch's CPU build from https://example.invalid/cpu" in done.stdout
    assert "did not answer" not in done.stdout

    done, calls = install(tmp_path, INDEX_DOWN="1")
    assert done.returncode == 0
    assert not any("--index-url" in call for call in calls)  # no pip retrying a dead host
    said = done.stdout.splitlines()  # one line
    assert len(said) == 1 and said[0].startswith(
        "PyTorch's CPU index https://download.pytorch.org/whl/cpu did not answer within 5 s")
    assert "about 6.3 GB installed" in said[0]
    assert done.stderr == ""


@CPU_ONLY_LINUX
def test_an_unreachable_cpu_index_is_one_line_within_seconds(tmp_path):
    """The probe itself (run by this python) against an address that never answers: one
    line within its timeout, where pip would retry for a minute."""
    import sys
    import time

    started = time.monotonic()
    done, calls = install(tmp_path, REAL_PYTHON=sys.executable, PROBE_S="1",
                          TORCH_CPU_INDEX="http://10.255.255.1/cpu")
    assert time.monotonic() - started < 10
    assert done.stdout.splitlines() == [done.stdout.splitlines()[0]]
    assert done.stdout.startswith(
        "PyTorch's CPU index http://10.255.255.1/cpu did not answer within 1 s")
    assert not any("--index-url" in call for call in calls)


def test_given_torch_installed_torch_and_a_gpu_are_respected(tmp_path):
    done, calls = install(tmp_path, TORCH="torch==2.13.0")
    assert (done.returncode, calls) == (0, ["-m pip install -q torch==2.13.0"])
    done, calls = install(tmp_path, HAS_TORCH="1")
    assert (done.returncode, done.stdout, calls) == (0, "", ["-c import torch"])
    done, calls = install(tmp_path, gpu=True)
    assert (done.returncode, done.stdout, calls) == (0, "", ["-c import torch"])

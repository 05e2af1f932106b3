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
  *--index-url*) [ -n "${INDEX_DOWN:-}" ] && exit 1 || exit 0 ;;
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


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None
                    or Path("/proc/driver/nvidia/version").exists()
                    or os.uname().sysname != "Linux", reason="needs Linux without NVIDIA GPU")
def test_a_cpu_only_linux_machine_gets_the_cpu_build_or_a_line_with_the_size(tmp_path):
    done, calls = install(tmp_path, TORCH_CPU_INDEX="https://example.invalid/cpu")
    assert done.returncode == 0, done.stderr
    assert calls[-1] == ("-m pip install -q --retries 1 --timeout 30 --index-url "
                         "https://example.invalid/cpu torch>=2.4,<=2.14.1")  # pyproject's pin
    assert "installing torch's CPU build from https://example.invalid/cpu" in done.stdout
    assert "could not be reached" not in done.stdout

    done, calls = install(tmp_path, INDEX_DOWN="1")
    assert done.returncode == 0
    said = done.stdout.splitlines()
    assert len(said) == 2 and said[1].startswith("PyTorch's CPU index could not be reached")
    assert "about 6.3 GB installed" in said[1]


def test_given_torch_installed_torch_and_a_gpu_are_respected(tmp_path):
    done, calls = install(tmp_path, TORCH="torch==2.13.0")
    assert (done.returncode, calls) == (0, ["-m pip install -q torch==2.13.0"])
    done, calls = install(tmp_path, HAS_TORCH="1")
    assert (done.returncode, done.stdout, calls) == (0, "", ["-c import torch"])
    done, calls = install(tmp_path, gpu=True)
    assert (done.returncode, done.stdout, calls) == (0, "", ["-c import torch"])

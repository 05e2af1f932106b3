"""A rul command that fails under make: rul's one line, then make's closing line naming rul's
exit code (not that of a test the recipe ran after it), make's exit 2; Ctrl-C's 130 is no
failure (tests/test_interrupts.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("target", ["train", "evaluate", "tune"])
def test_a_bad_key_under_make_is_rul_s_line_and_its_exit_code(target, tmp_path):
    venv = Path(sys.executable).parent.parent
    stamp = venv / ".installed"  # `make -o`: never reinstall here
    alone = {k: v for k, v in os.environ.items()  # not a sub-make of `make test`'s
             if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "-o", str(stamp), target,
                           f"VENV={venv}", f"STAMP={stamp}", "ARGS=epochs=-1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=alone)
    said = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert said[0] == "Error: command line: epochs=-1: must be a positive integer"
    assert said[1:] == [f"make: *** [Makefile:{_line(target)}: {target}] Error 2"]


def _line(target: str) -> int:
    """The Makefile line of `target`'s rul command."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1)
                if line.startswith(f"\t$(BIN)/rul {target} "))

"""What a served model costs in memory with many engines: onnxruntime's arena grows to hold
one call's activations and keeps them, so the windows per call bound the memory many one-row
engines take (a 1.1 MB CSV of 20,000 took +465 MB at 4,096 windows a call). A body of them is
now refused for its engines (rul.serving.admission): the model is given their rows directly."""

import subprocess
import sys
from pathlib import Path

import pytest
from test_inference import tiny_model_folder

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ENGINES = 20_000
MOST_MB = 300  # +164 MB measured at 1,024 windows a call

MEASURE = """
import gc, sys
import numpy as np, pandas as pd
from rul.data.schema import COLUMNS
from rul.serving import served
from rul.data.validation import validate_rows
model = served.Served(served.load(sys.argv[1]))
n = int(sys.argv[2])
frame = pd.DataFrame({c: np.ones(n, dtype=np.int64) for c in COLUMNS})
frame["unit"] = np.arange(1, n + 1)
rows = validate_rows(frame)
del frame
gc.collect()
def peak_kb():  # this process's own peak (ru_maxrss keeps the peak of its parent before exec)
    return int(next(line for line in open("/proc/self/status")
                    if line.startswith("VmHWM")).split()[1])
before = peak_kb()
assert len(model.predict(rows)) == n
print((peak_kb() - before) // 1024)
"""


def test_many_one_row_engines_stay_within_a_bounded_memory(tmp_path, fd001):
    folder = tiny_model_folder(fd001, tmp_path)
    done = subprocess.run([sys.executable, "-c", MEASURE, folder, str(ENGINES)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < MOST_MB, done.stdout

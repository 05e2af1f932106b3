#!/bin/sh
# `make install`'s torch, chosen for the machine before rul's other requirements:
#   TORCH=...                  that requirement, as given (CI: TORCH=torch==2.13.0);
#   torch already installed    kept;
#   Linux without an NVIDIA GPU
#                              the CPU build from PyTorch's CPU index ($TORCH_CPU_INDEX);
#                              the index is asked once first (PROBE_S seconds, no retry):
#                              where it does not answer, one line saying that torch will come
#                              with the other requirements, and how big that download is;
#   otherwise                  nothing here: pip takes torch (with CUDA on Linux) from the
#                              package index with the other requirements.
# Usage: tools/install_torch.sh PYTHON   (the virtualenv's python)
set -eu
python="$1"
index="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
here="$(dirname "$0")/.."
# the torch requirement of pyproject.toml, the one place that pins it
spec="$(sed -n 's/^ *"\(torch[<>=!~][^"]*\)".*/\1/p' "$here/pyproject.toml" | head -n 1)"

if [ -n "${TORCH:-}" ]; then
    exec "$python" -m pip install -q "$TORCH"
fi
if "$python" -c "import torch" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(uname -s)" != Linux ] || command -v nvidia-smi >/dev/null 2>&1 \
        || [ -e /proc/driver/nvidia/version ]; then
    exit 0
fi
probe_s="${PROBE_S:-5}"
# One request to the index, PROBE_S seconds at most: pip would retry an unknown host for a
# minute and print a warning per attempt.
if "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))" \
        "$index/torch/" "$probe_s" >/dev/null 2>&1; then
    echo "no NVIDIA GPU: installing torch's CPU build from $index (the virtualenv ends near 2.2 GB)"
    if "$python" -m pip install -q --retries 0 --timeout 30 --index-url "$index" "$spec"; then
        exit 0
    fi
fi
echo "PyTorch's CPU index $index did not answer within ${probe_s} s: torch comes from the package index with the" \
     "other requirements, on Linux the CUDA build (about 6.3 GB installed, 5 minutes measured);" \
     "make clean, then TORCH='torch==<version>+cpu' or TORCH_CPU_INDEX=<a mirror> avoids it"

#!/bin/sh
# `make install`'s torch, chosen for the machine before rul's other requirements:
#   TORCH=...                  that requirement, as given (CI: TORCH=torch==2.13.0);
#   torch already installed    kept;
#   Linux without an NVIDIA GPU
#                              the CPU build from PyTorch's CPU index ($TORCH_CPU_INDEX);
#                              if that index cannot be reached, a line saying that torch will
#                              come with the other requirements, and how big that download is;
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
echo "no NVIDIA GPU: installing torch's CPU build from $index (the virtualenv ends near 2.2 GB)"
if "$python" -m pip install -q --retries 1 --timeout 30 --index-url "$index" "$spec"; then
    exit 0
fi
echo "PyTorch's CPU index could not be reached: torch comes from the package index with the" \
     "other requirements, on Linux the CUDA build (about 6.3 GB installed, 5 minutes measured);" \
     "make clean, then TORCH='torch==<version>+cpu' or TORCH_CPU_INDEX=<a mirror> avoids it"

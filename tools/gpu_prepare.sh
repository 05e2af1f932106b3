#!/bin/bash
# Readies this checkout for tools/gpu_session.sh on a lent CUDA machine, which has torch and
# most of rul's dependencies but no package index. Run once here (needs the registries); the
# three folders it writes are git-ignored and travel with the run as carry [".whl", ".cmapss",
# ".gitcopy"]:
#   .whl      ../shared/gpu/wheels.sh's wheels (mlflow, optuna, pydantic: ~36 MB) and those of
#             the `peers` extra the machine lacks (Lightning: pure Python, ~3 MB; it holds
#             accelerate), installed there without their dependencies
#   .cmapss   the C-MAPSS files
#   .gitcopy  this checkout's .git (the run there names its commit)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p .git/info
for path in /.whl/ /.cmapss/ /.gitcopy/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done
bash ../shared/gpu/wheels.sh .whl
# The peers extra as pyproject.toml pins it, less what the machine holds, and what Lightning
# needs beyond it (its own packages; the rest, torch and fsspec among them, are there).
lightning=$(python3 -c "import tomllib; print(' '.join(p for p in tomllib.load(open(
  'pyproject.toml', 'rb'))['project']['optional-dependencies']['peers'] if 'accelerate' not in p))")
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp -d .whl "$@" 2>&1 | grep -v "^WARNING: Location" || true
}
download $lightning lightning-utilities torchmetrics
version=$(ls .whl | sed -n 's/^lightning-\([0-9.]*\)-py3-none-any\.whl$/\1/p' | sort -V | tail -1)
[ -n "$version" ] || { echo "Lightning's wheel did not download"; exit 1; }
download "pytorch-lightning==$version"  # lightning $version requires it, at its own version
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl (Lightning $version)"
rm -rf .cmapss .gitcopy
cp -r ../shared/cmapss .cmapss
cp -r .git .gitcopy
echo "ready: carry [\".whl\", \".cmapss\", \".gitcopy\"]; dry run: GPU_SESSION_DRY=1 bash tools/gpu_session.sh timed"

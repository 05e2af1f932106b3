#!/bin/bash
# Everything a lent CUDA machine is for, in one go, in 9.5 minutes, results under $OUT.
#
# Prepare here (once per checkout; the folders are ignored and travel as `carry`):
#   echo /.whl/ >> .git/info/exclude; echo /.cmapss/ >> .git/info/exclude
#   echo /.gitcopy/ >> .git/info/exclude
#   bash ../shared/gpu/wheels.sh .whl          # mlflow, optuna, pydantic (~36 MB)
#   rm -rf .cmapss .gitcopy; cp -r ../shared/cmapss .cmapss; cp -r .git .gitcopy
# Run there (the device tool): carry [".whl", ".cmapss", ".gitcopy"], timeout_s 595,
#   command: bash tools/gpu_session.sh
# Without CUDA (here) `GPU_SESSION_DRY=1 bash tools/gpu_session.sh` runs the same steps with
# tiny sizes and short clocks, to check the script itself.
#
#   phase 1, the GPU to itself (what is timed): make gpu-check's recipe, splits, profile,
#            train, members and peers sections
#   phase 2, side by side: gpu-check's split, resume, rerun and tune sections, then
#            `pytest -m gpu`; the everyday tier (`make test`'s selection) with the GPU
#            present; the card recipe's study (experiments/tune_fd001_b512.yaml) and the
#            5-seed evaluations of its winner and of today's recipe, logged to one store
#   end:     the logs, the JSON results, the profile and the store (mlflow.db, the study's
#            journal) under $OUT, 6 files at most
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
DRY=${GPU_SESSION_DRY:-0}
start=$(date +%s)
BUDGET=${GPU_SESSION_SECONDS:-570}  # the script ends by itself this long after it started
say() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() {  # seconds left, less $1 (20 at least)
  local n=$(( start + BUDGET - $(date +%s) - ${1:-0} )); echo $(( n < 20 ? 20 : n )); }
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 MLFLOW_TRACKING_URI= GIT_PYTHON_REFRESH=quiet
export CMAPSS_DIR=${CMAPSS_DIR:-$ROOT/.cmapss}

# --- set-up: the wheels, rul's entry points, the commit ------------------------------------
if [ "$DRY" = 1 ]; then
  PY=${PY:-$ROOT/.venv/bin/python}; T1=150; JOBS=2; TESTS=tests/test_tuning.py
else
  PY=python3; T1=280; JOBS=8; TESTS=tests
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheels did not install"; exit 1; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  if [ -d .gitcopy ] && [ ! -d .git ]; then mv .gitcopy .git; fi
  # rul's dist-info beside the wheels: its console script and the `mlflow ui --app-name rul`
  # entry point (the code itself is imported from this folder, first on the path)
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . \
    >"$WORK/install.log" 2>&1 || say "rul's entry points did not install (see install.log)"
  rm -rf build rul.egg-info
  export PYTHONPATH=$ROOT:/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"

# --- phase 1: the timed sections, the GPU to itself ------------------------------------------
say "phase 1: gpu-check recipe splits profile train members peers"
timeout -s INT -k 20 $T1 $PY -m bench.gpu_check --only recipe splits profile train members \
  peers --json "$WORK/results" >"$OUT/phase1.log" 2>&1
say "phase 1 ended (exit $?)"

# --- phase 2: side by side --------------------------------------------------------------------
say "phase 2: correctness sections + pytest -m gpu | everyday tier | study + evaluations"
( timeout -s INT -k 20 $(left 150) $PY -m bench.gpu_check --only split resume rerun tune \
    --json "$WORK/results"; echo "gpu-check part 2: exit $?"
  timeout -s INT -k 20 120 $PY -m pytest -m gpu -q -p no:cacheprovider tests
  echo "pytest -m gpu: exit $?" ) >"$OUT/phase2_checks.log" 2>&1 &
checks=$!
( timeout -s INT -k 20 $(left 10) $PY -m pytest -m "not slow" -n $JOBS --dist loadfile -q \
    -p no:cacheprovider --junitxml "$WORK/results/everyday.xml" $TESTS
  echo "everyday tier: exit $?" ) >"$OUT/phase2_pytest.log" 2>&1 &
tests=$!
(
  store="sqlite:///$WORK/store/mlflow.db"; mkdir -p "$WORK/store"
  common=("tracking_uri=$store" "checkpoint_dir=$WORK/ckpt") short=()
  [ "$DRY" = 1 ] && common+=("filters=4" "hidden_size=16") && short=("epochs=2")
  journal="$WORK/store/optuna.journal" study=experiments/tune_fd001_b512.yaml
  if [ "$DRY" = 1 ]; then  # trials of 1 or 2 epochs
    sed -e 's/choices: \[100, 150\]/choices: [2, 3]/' -e 's/high: 10}/high: 1}/' $study \
      >"$WORK/tune.yaml"; study=$WORK/tune.yaml
  fi
  # trials start until 190 s before the end; the evaluations have the last 150 s or more
  timeout -s INT -k 10 $(left 160) $PY -m rul tune $study --workers 3 --n-trials 200 \
    --timeout $(left 190) --storage "$journal" "${common[@]}"
  echo "study: exit $?"
  best=$($PY tools/study_best.py "$journal" rul-fd001-b512-recipe)
  echo "study's best: $best"
  timeout -s INT -k 10 $(left 15) $PY -m rul evaluate experiments/fd001.yaml --seeds 5 --jobs 5 \
    --no-progress "${common[@]}" $best "${short[@]}" &
  timeout -s INT -k 10 $(left 15) $PY -m rul evaluate experiments/fd001.yaml --seeds 5 \
    --jobs 5 --no-progress "${common[@]}" "${short[@]}" &
  wait
  echo "evaluations ended"
) >"$OUT/phase2_study.log" 2>&1 &
study=$!
wait $checks; say "checks + pytest -m gpu ended"
wait $tests; say "everyday tier ended"
wait $study; say "study and evaluations ended"

# --- the results back -------------------------------------------------------------------------
cp "$WORK/install.log" "$WORK/results/" 2>/dev/null
rm -rf "$WORK/store/mlruns"  # the models: the Results page reads the runs, not their artifacts
tar -czf "$OUT/results.tar.gz" -C "$WORK" results store 2>/dev/null
say "done: $(ls "$OUT" | tr '\n' ' ')"
grep -hi "rows hold\|passed\|failed\|study's best\|RMSE\|exit" "$OUT"/*.log | grep -v "^\[W" \
  | tail -40 >"$OUT/summary.txt"
cat "$OUT/summary.txt"
rm -rf "$WORK"

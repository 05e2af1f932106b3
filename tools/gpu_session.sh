#!/bin/bash
# Everything a lent CUDA machine is for, in two calls of the device tool back to back (the
# second within the machine's 30 s warm window), results under $OUT each time:
#   bash tools/gpu_session.sh timed   about 8 min (timeout_s 530): the GPU to itself
#   bash tools/gpu_session.sh side    5 min (timeout_s 320): the rest side by side
#   bash tools/gpu_session.sh search  9 min (timeout_s 600): a session's one call for the best
#                                     model's study and the 5-seed evaluations of its winner
# With the machine's start (1-2 min) that is all of a session's 15 minutes; with less, run
# `timed` alone (the promises' figures) and leave `side` to the next session. `timed` grew by a
# minute when the default recipe went from 100 to 150 epochs (its recipe and train sections).
#
# Prepare here, once per checkout: `bash tools/gpu_prepare.sh` (the wheels the machine lacks,
# Lightning's for the peers among them, the data and the commit, in three ignored folders).
# Run there with carry [".whl", ".cmapss", ".gitcopy"]. Without CUDA (here)
# `GPU_SESSION_DRY=1 bash tools/gpu_session.sh PART` runs the same steps with tiny sizes and
# short clocks, to check the script itself.
#
#   timed: make gpu-check's recipe, splits, profile, train, members and peers sections
#          (phase1.log, the JSON result and profile.txt in results.tar.gz)
#   side:  gpu-check's split, resume, rerun and tune sections, then `pytest -m gpu`; the
#          everyday tier (`make test`'s selection) with the GPU present, one line per test,
#          its failures rerun one by one for their tracebacks; the card recipe's study
#          (experiments/tune_fd001_b512.yaml) and the 5-seed evaluations of its winner and
#          of today's recipe, logged to one store (mlflow.db and the study's journal in
#          results.tar.gz: `rul report --tracking-uri sqlite:///.../mlflow.db`)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
DRY=${GPU_SESSION_DRY:-0}
PART=${1:-timed}
case $PART in timed) DEFAULT_BUDGET=500 ;; side) DEFAULT_BUDGET=300 ;; search) DEFAULT_BUDGET=560 ;;
  *) echo "usage: tools/gpu_session.sh timed|side|search"; exit 2 ;; esac
start=$(date +%s)
BUDGET=${GPU_SESSION_SECONDS:-$DEFAULT_BUDGET}  # the part ends by itself this long after it began
say() { echo "[$(( $(date +%s) - start )) s] $*"; }
left() {  # seconds left, less $1 (20 at least)
  local n=$(( start + BUDGET - $(date +%s) - ${1:-0} )); echo $(( n < 20 ? 20 : n )); }
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 MLFLOW_TRACKING_URI= GIT_PYTHON_REFRESH=quiet
export CMAPSS_DIR=${CMAPSS_DIR:-$ROOT/.cmapss}

# --- set-up: the wheels, rul's entry points, the commit ------------------------------------
if [ "$DRY" = 1 ]; then
  PY=${PY:-$ROOT/.venv/bin/python}; JOBS=2; TESTS="tests/test_tuning.py tests/test_stacked.py"
else
  PY=python3; JOBS=8; TESTS=tests
  [ -d /tmp/site/mlflow ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheels did not install"; exit 1; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  if [ -d .gitcopy ]; then rm -rf .git; mv .gitcopy .git; fi  # this checkout's commit
  # rul's dist-info beside the wheels: its console script and the `mlflow ui --app-name rul`
  # entry point (the code itself is imported from this folder, first on the path)
  [ -d /tmp/site/bin/rul ] || [ -f /tmp/site/bin/rul ] || python3 -m pip install -q \
    --no-index --no-deps --no-build-isolation --target /tmp/site . >"$WORK/install.log" 2>&1 \
    || say "rul's entry points did not install (see install.log)"
  rm -rf build rul.egg-info
  export PYTHONPATH=$ROOT:/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
TIMEOUT=$($PY -c "import pytest_timeout" 2>/dev/null && echo --timeout)  # per test, if there
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"

finish() {  # the results back: 7 files at most under $OUT
  mkdir -p "$WORK/results" "$WORK/store"
  cp "$WORK/install.log" "$WORK/results/" 2>/dev/null
  cp "$WORK"/store/*.journal "$WORK/results/" 2>/dev/null  # the study, if the store is too big
  rm -rf "$WORK/store/mlruns"  # the models: the Results page reads the runs, not their files
  # the per-step curves too (a study's trials log millions of rows, 26 MB for 25 trainings
  # of make train's recipe): the Results page and tools/validation_limits.py read the runs'
  # figures and per-epoch metrics. Still apart: a store over the 16 MB a file may come back
  # in must not keep the logs from coming back, as it once did
  [ -f "$WORK/store/mlflow.db" ] && $PY - "$WORK/store/mlflow.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("DELETE FROM metrics WHERE key IN ('clipped', 'train/grad_norm', 'train/loss', "
           "'train/lr', 'amp_scale', 'skipped_steps')")
db.commit()
db.execute("VACUUM")
db.close()
PY
  tar -czf "$OUT/results.tar.gz" -C "$WORK" results 2>/dev/null
  tar -czf "$OUT/store.tar.gz" -C "$WORK" store 2>/dev/null
  grep -hi "rows hold\|passed\|failed\|study's best\|rmse\|exit" "$OUT"/*.log \
    | grep -v "^\[W\|PASSED" | tail -60 >"$OUT/summary.txt"
  say "done: $(ls "$OUT" | tr '\n' ' ')"
  cat "$OUT/summary.txt"
  rm -rf "$WORK"
}

if [ "$PART" = timed ]; then
  say "timed: gpu-check recipe splits profile train members peers"
  timeout -s INT -k 20 $(left 15) $PY -m bench.gpu_check --only recipe splits profile train \
    members peers --json "$WORK/results" >"$OUT/phase1.log" 2>&1
  say "timed part ended (exit $?)"
  finish
  exit 0
fi

if [ "$PART" = search ]; then
  # experiments/tune_fd001_muon_batch.yaml on 8 workers, trials started until 260 s before the
  # end; then its best trial and make train's recipe over seeds 42-46, side by side, and over
  # 47-51 when as long again is left; each evaluation's per-seed test-like validation and
  # p_fail Brier (tools/interval_report.py) and what limits it (tools/validation_limits.py)
  # last. The runs in store.tar.gz; the logs, reports and the study's journal in
  # results.tar.gz.
  say "search: study, then the evaluations of its best and of make train's recipe"
  store="sqlite:///$WORK/store/mlflow.db"; mkdir -p "$WORK/store" "$WORK/results"
  common=("tracking_uri=$store" "checkpoint_dir=$WORK/ckpt") short=()
  journal="$WORK/store/optuna.journal" study=experiments/tune_fd001_muon_batch.yaml workers=8
  if [ "$DRY" = 1 ]; then  # trials of 1 or 2 epochs on a tiny network
    common+=("filters=4" "hidden_size=16") short=("epochs=2") workers=2
    sed -e 's/choices: \[20, 35, 50\]/choices: [1, 2]/' -e 's/^epochs: 35/epochs: 2/' \
      -e 's/choices: \[128, 256, 512\]/choices: [256, 512]/' \
      $study >"$WORK/tune.yaml"; study=$WORK/tune.yaml
  fi
  timeout -s INT -k 10 $(left 230) $PY -m rul tune $study --workers $workers \
    --timeout $(left 260) --storage "$journal" "${common[@]}" >"$OUT/search_study.log" 2>&1
  say "study: exit $?"
  best=$($PY tools/study_best.py "$journal" rul-fd001-muon-batch)
  say "study's best: $best"
  evaluate() {  # CONFIG-OVERRIDES... : one 5-seed evaluation, its log in the results
    local name=$1; shift
    timeout -s INT -k 10 $(left 40) $PY -m rul evaluate experiments/fd001.yaml --seeds 5 --jobs 5 \
      --no-progress "${common[@]}" "$@" "${short[@]}" >"$WORK/results/evaluate-$name.log" 2>&1
    say "evaluation $name: exit $? (val, test: $(grep "^  mean" "$WORK/results/evaluate-$name.log" \
      | awk '{print $2, $5}'))"
  }
  round() {  # SEED: the best trial and make train's recipe from SEED on, side by side
    local began=$(date +%s)
    evaluate "recipe-$1" "seed=$1" &
    # beside it, at no cost in wall time, even where trial 0 (the recipe itself) won
    [ -n "$best" ] && evaluate "best-$1" "seed=$1" $best micro_batch_size=auto &
    wait
    took=$(( $(date +%s) - began ))
  }
  round 42
  if [ $(( start + BUDGET - $(date +%s) )) -gt $(( took + 60 )) ]; then round 47
  else say "no time for seeds 47-51 (a round took $took s)"; fi
  # each evaluation's test-like validation and Brier, from its logged models
  parents=$($PY - "$store" <<'PY'
import sys, mlflow
client = mlflow.MlflowClient(sys.argv[1])
for e in client.search_experiments():
    for r in client.search_runs([e.experiment_id], "tags.`rul.kind` = 'evaluate'"):
        if r.info.status == "FINISHED":
            print(r.info.run_id)
PY
)
  for p in $parents; do
    MLFLOW_TRACKING_URI=$store timeout -s INT -k 5 $(left 10) $PY tools/interval_report.py \
      --parent "$p" >"$WORK/results/intervals-$p.txt" 2>&1 &
    MLFLOW_TRACKING_URI=$store timeout -s INT -k 5 $(left 10) $PY tools/validation_limits.py \
      --parent "$p" >"$WORK/results/limits-$p.txt" 2>&1 &
  done
  wait
  say "interval and limits reports: $(echo $parents | wc -w) each"
  cp "$OUT/search_study.log" "$WORK/results/"
  grep -hv "^child\|^browse" "$WORK"/results/evaluate-*.log >"$OUT/search_eval.log"
  finish
  exit 0
fi

# --- phase 2: side by side --------------------------------------------------------------------
say "side: correctness sections + pytest -m gpu | everyday tier | study + evaluations"
( timeout -s INT -k 20 $(left 150) $PY -m bench.gpu_check --only split resume rerun tune \
    --json "$WORK/results"; echo "gpu-check part 2: exit $?"
  timeout -s INT -k 20 120 $PY -m pytest -m gpu -q -p no:cacheprovider tests
  echo "pytest -m gpu: exit $?" ) >"$OUT/phase2_checks.log" 2>&1 &
checks=$!
( timeout -s INT -k 20 $(left 45) $PY -m pytest -m "not slow" -n $JOBS --dist loadfile -v \
    -p no:cacheprovider -p no:benchmark ${TIMEOUT:+$TIMEOUT 240} $TESTS
  echo "everyday tier: exit $?"
  # each failure again, alone, for its traceback (the parallel run's summary comes last)
  failed=$(grep -o "FAILED tests/[^ ]*" "$OUT/phase2_pytest.log" | cut -d' ' -f2 | sort -u)
  if [ -n "$failed" ]; then
    timeout -s INT -k 5 $(left 5) $PY -m pytest -q -p no:cacheprovider -p no:benchmark \
      --tb=short ${TIMEOUT:+$TIMEOUT 60} $failed
    echo "failures rerun: exit $?"
  fi ) >"$OUT/phase2_pytest.log" 2>&1 &
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

finish

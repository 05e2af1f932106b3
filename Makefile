# rul: `make train` and `make test` work as the first command on a fresh clone; both install
# what they need into .venv on first use (and again only when pyproject.toml changes).
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CONFIG  ?= experiments/fd001.yaml
TUNE_CONFIG ?= experiments/tune_fd001.yaml
# Extra arguments for train/evaluate/tune/test, e.g. make train ARGS="epochs=5 model=lstm"
ARGS    ?=
# `make evaluate`: trainings of CONFIG, seeds seed, seed+1, ... (docs: Results)
SEEDS   ?= 5
# `make evaluate`: seeds trained side by side in worker processes (the CPU threads split), e.g. JOBS=2
JOBS    ?= 1
# `make server` (an MLflow tracking server for workers on other machines, docs: Scale out)
# and `make serve` (a model's scoring server) listen here. HOST=0.0.0.0 to serve the network;
# SERVER_BACKEND may be a postgresql:// URL.
HOST    ?= 127.0.0.1
PORT    ?= 5000
SERVER_BACKEND   ?= sqlite:///mlflow-server.db
SERVER_ARTIFACTS ?= ./mlartifacts
SERVER_ARGS      ?=
# Processes for one training run (DDP via torchrun: gloo on CPU, nccl on CUDA), e.g. NPROC=2
NPROC   ?= 1
# The torch requirement installed first, e.g. TORCH=torch==2.13.0. Unset: on Linux without an
# NVIDIA GPU, the CPU build from TORCH_CPU_INDEX (tools/install_torch.sh says what it does).
TORCH   ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# `make report`: rul report's options, e.g. REPORT_ARGS="--tracking-uri http://host:5000"
BENCH_RESULTS ?= bench/results
REPORT_ARGS   ?=
DOCS_STAMP := $(VENV)/.docs-installed
# A long command stopped with Ctrl-C (exit 130) has said what it kept: make adds no "Error 130"
# line. (From a terminal make is interrupted too, and says "Interrupt" as it always does.)
# Any other failure keeps rul's exit code, which make's closing line names (`Error 2`: bad
# input). GNU make prints that line for every failed recipe and exits 2 whatever the code; only
# an ignored failure is silent, and it exits 0, so the line stays: rul's own line above it says
# what is wrong.
STOPPED_OK := || { code=$$?; test $$code -eq 130 || exit $$code; }

# Use the C-MAPSS copy beside this checkout when there is one (see docs: Getting started, Data).
ifneq ($(wildcard ../shared/cmapss/train_FD001.txt),)
CMAPSS_DIR ?= $(abspath ../shared/cmapss)
endif
ifdef CMAPSS_DIR
export CMAPSS_DIR
endif

.PHONY: install train evaluate tune test test-e2e test-all test-durations ui serve server bench \
	gpu-check lint clean docs report screenshots

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	TORCH='$(TORCH)' TORCH_CPU_INDEX='$(TORCH_CPU_INDEX)' tools/install_torch.sh $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,postgres]'
	touch $(STAMP)

train: $(STAMP)
ifeq ($(NPROC),1)
	$(BIN)/rul train $(CONFIG) $(ARGS) $(STOPPED_OK)
else
	$(BIN)/torchrun --nproc-per-node $(NPROC) --standalone -m rul train $(CONFIG) $(ARGS) \
		$(STOPPED_OK)
endif

evaluate: $(STAMP)
	$(BIN)/rul evaluate $(CONFIG) $(ARGS) --seeds $(SEEDS) --jobs $(JOBS) $(STOPPED_OK)

tune: $(STAMP)
	$(BIN)/rul tune $(TUNE_CONFIG) $(ARGS) $(STOPPED_OK)

# The suite in two tiers, in parallel worker processes (pytest-xdist), one per core up to 4,
# each test file on one worker (its module fixtures are built once), the longest files first
# (as tests/durations.json records them; --no-loadscope-reorder keeps that order), ending with
# its 15 slowest tests. TEST_JOBS=0 runs in this process.
# `make test`: everything but the end-to-end tier (marker `slow`: rul in other processes,
# servers, a full disk, long trainings on the real data). `make test-e2e`: that tier alone.
# `make test-all`: both in one session. CI runs `make test`, then `make test-e2e`.
# `make test-durations`: both tiers, recording each file's seconds in tests/durations.json (run
# it after a change that moves a file's time, and commit the file).
TEST_JOBS ?= auto
PARALLEL := $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --maxprocesses 4 --dist loadfile \
                                            --no-loadscope-reorder) --durations=15
test: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m "not slow" $(ARGS)

test-e2e: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m slow $(ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) $(ARGS)

test-durations: $(STAMP)
	RUL_RECORD_DURATIONS=$(abspath tests/durations.json) $(BIN)/python -m pytest $(PARALLEL) $(ARGS)

# The UI of a local store (default ./mlflow.db; STORE= another, e.g. the MLFLOW_TRACKING_URI
# a run used); `rul train` prints this command, with the store and port it used. It prints each
# experiment's address once it answers; a new browser opens on the runs in the Model training
# view. One web worker, no job consumers, no usage data sent; Ctrl-C stops it and every
# process it started, exit 0 (rul.tracking.ui).
UI_PORT ?= 5000
STORE   ?= sqlite:///mlflow.db
ui: $(STAMP)
	$(BIN)/python -m rul.tracking.ui --backend-store-uri '$(STORE)' \
		--default-artifact-root ./mlruns --host 127.0.0.1 --port $(UI_PORT)

# `make serve`: a registered model behind rul's guarded server (rul/serving/server.py: MLflow's
# routes and formats, strict JSON, a memory budget, deadlines, a connection cap, one-line
# refusals), from this project's environment (docs: Predict and serve), e.g. make serve
# MODEL=models:/rul-fd001/3 PORT=5001 SERVE_ARGS="--memory-mb 512 --timeout 30".
SERVE_ARGS ?=
# The local store unless MLFLOW_TRACKING_URI says otherwise.
MODEL   ?= models:/rul-fd001@champion
serve: $(STAMP)
	MLFLOW_TRACKING_URI="$${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db}" \
		$(BIN)/python -m rul.serving.server "$(MODEL)" --host $(HOST) --port $(PORT) \
		$(SERVE_ARGS)

# rul.tracking.ui runs `mlflow server` with rul's driver rule for a postgresql:// backend and
# stops it with every process it started.
server: $(STAMP)
	$(BIN)/python -m rul.tracking.ui server --backend-store-uri '$(SERVER_BACKEND)' \
		--artifacts-destination $(SERVER_ARTIFACTS) --serve-artifacts \
		--host $(HOST) --port $(PORT) $(SERVER_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

# `make gpu-check`: the GPU path's promises on one GPU in about 5 minutes, one table, exit 1
# when one fails (bench/gpu_check.py; a dry run with tiny sizes on a machine without CUDA).
# ARGS="--json bench/results" keeps its results for `make report`.
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check $(ARGS)

# The docs site (mkdocs-material, the `docs` extra), built strictly: a warning, a broken link
# or anchor fails it. CI runs it. The configuration and CLI reference pages are generated from
# the code during the build.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,postgres,docs]'
	touch $(DOCS_STAMP)

# The Results and Performance pages and their figures, from the evaluation runs of the store
# (MLFLOW_TRACKING_URI or ./mlflow.db), the benches' JSON in BENCH_RESULTS
# (`make bench ARGS="speed memory --json bench/results"`) and docs/data/*.yaml.
report: $(STAMP)
	$(BIN)/rul report $(if $(wildcard $(BENCH_RESULTS)/*.json),--bench-dir $(BENCH_RESULTS)) \
		$(REPORT_ARGS)

# The MLflow UI screenshots of the docs (docs/assets/mlflow_*.png): the browser test saves them
# when RUL_SCREENSHOTS names a folder (needs Chromium and the C-MAPSS data).
screenshots: $(STAMP)
	RUL_SCREENSHOTS=$(abspath docs/assets) $(BIN)/python -m pytest -q tests/test_ui_browser.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build site *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

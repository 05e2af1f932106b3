# rul: `make train` and `make test` work as the first command on a fresh clone; both install
# what they need into .venv on first use (and again only when pyproject.toml changes).
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
CONFIG  ?= experiments/fd001.yaml
TUNE_CONFIG ?= experiments/tune_fd001.yaml
# Extra arguments for train/evaluate/tune/test, e.g. make train ARGS="epochs=5 model=lstm"
ARGS    ?=
# `make evaluate`: trainings of CONFIG, seeds seed, seed+1, ... (README: Honest evaluation)
SEEDS   ?= 5
# `make evaluate`: seeds trained side by side in worker processes (the CPU threads split), e.g. JOBS=2
JOBS    ?= 1
# `make server` (an MLflow tracking server for workers on other machines, README: Scaling out)
# and `make serve` (a model's scoring server) listen here. HOST=0.0.0.0 to serve the network;
# SERVER_BACKEND may be a postgresql:// URL.
HOST    ?= 127.0.0.1
PORT    ?= 5000
SERVER_BACKEND   ?= sqlite:///mlflow-server.db
SERVER_ARTIFACTS ?= ./mlartifacts
SERVER_ARGS      ?=
# Processes for one training run (DDP via torchrun: gloo on CPU, nccl on CUDA), e.g. NPROC=2
NPROC   ?= 1
# Optional torch requirement installed first, e.g. TORCH=torch==2.13.0 for the CPU build.
TORCH   ?=

# Use the C-MAPSS copy beside this checkout when there is one (see README: Data).
ifneq ($(wildcard ../shared/cmapss/train_FD001.txt),)
CMAPSS_DIR ?= $(abspath ../shared/cmapss)
endif
ifdef CMAPSS_DIR
export CMAPSS_DIR
endif

.PHONY: install train evaluate tune test test-fast ui serve server bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q -e '.[dev,postgres]'
	touch $(STAMP)

train: $(STAMP)
ifeq ($(NPROC),1)
	$(BIN)/rul train $(CONFIG) $(ARGS)
else
	$(BIN)/torchrun --nproc-per-node $(NPROC) --standalone -m rul train $(CONFIG) $(ARGS)
endif

evaluate: $(STAMP)
	$(BIN)/rul evaluate $(CONFIG) $(ARGS) --seeds $(SEEDS) --jobs $(JOBS)

tune: $(STAMP)
	$(BIN)/rul tune $(TUNE_CONFIG) $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(ARGS)

# The UI of the local store; `rul train` prints this command and the address with the port.
# Ctrl-C stops it and every process it started (rul.tracking.ui).
UI_PORT ?= 5000
ui: $(STAMP)
	$(BIN)/python -m rul.tracking.ui --backend-store-uri sqlite:///mlflow.db \
		--default-artifact-root ./mlruns --host 127.0.0.1 --port $(UI_PORT)

# `make serve`: a registered model behind MLflow's scoring server, run from this project's
# environment (README: Serving), e.g. make serve MODEL=models:/rul-fd001/3 PORT=5001.
# The local store unless MLFLOW_TRACKING_URI says otherwise.
MODEL   ?= models:/rul-fd001@champion
serve: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" \
		MLFLOW_TRACKING_URI="$${MLFLOW_TRACKING_URI:-sqlite:///mlflow.db}" \
		$(BIN)/mlflow models serve -m "$(MODEL)" --env-manager local --host $(HOST) \
		--port $(PORT)

server: $(STAMP)
	$(BIN)/mlflow server --backend-store-uri $(SERVER_BACKEND) \
		--artifacts-destination $(SERVER_ARTIFACTS) --serve-artifacts \
		--host $(HOST) --port $(PORT) $(SERVER_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

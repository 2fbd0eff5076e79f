# The few verbs people type. Every target sets up what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-torchtitan test lint bench cluster clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/datalane demo

# TorchTitan's debug llama3 on CPU (gloo): DP 2, DP 2 -> 1 and DP 1 -> 2 through its checkpointer,
# the same global batch hash at every step (a few minutes on 2 cores).
demo-torchtitan: $(STAMP)
	$(BIN)/python -m datalane.demo_torchtitan

lint: $(STAMP)
	$(BIN)/ruff check datalane sidecar operator tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The test control plane (kube-apiserver, etcd, kwok, helm, ...) built from Go modules into
# ~/.cache/datalane/cluster: ~25 min on a fresh 2-core machine, seconds once cached.
cluster:
	bash tests/cluster/build.sh

test: $(STAMP) lint cluster
	$(BIN)/python -m pytest -q

PEERS := .venv-peers
$(PEERS)/.installed:
	$(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet --upgrade pip
	$(PEERS)/bin/pip install --quiet zephon==0.2.0 transformers pyarrow tokenizers numpy
	touch $(PEERS)/.installed

bench: $(STAMP) $(PEERS)/.installed
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The few verbs people type. Every target sets up what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench cluster clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/datalane demo

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

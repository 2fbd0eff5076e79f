# The few verbs people type. Every target sets up what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-torchtitan demo-vlm check test lint bench cluster images playground \
	playground-down clean generate

# Everything (the dev extra: torch, TorchTitan, the test and lint tools; about 6.7 GB with CUDA
# torch). pip shows its progress: a cold install takes minutes.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

# Only what `datalane demo` imports (the demo extra: the engine, no torch, no test tools), with
# a stamp of its own so a later `make test` still installs everything.
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[demo]'
	touch $(DEMO_STAMP)

setup: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/datalane demo

# TorchTitan's debug llama3 on CPU (gloo): DP 2, DP 2 -> 1 and DP 1 -> 2 through its checkpointer,
# the same global batch hash at every step (a few minutes on 2 cores).
demo-torchtitan: $(STAMP)
	$(BIN)/python -m datalane.demos.torchtitan

# A tiny Qwen3.5 vision-language model on CPU (gloo) on generated image-caption pairs: DP 2, DP 1,
# DP 2 -> 1 and DP 1 -> 2 through a checkpoint, the same global batch hash at every step and the
# losses within float tolerance (`--short`: the CI size, about 2 minutes on 2 cores).
demo-vlm: $(STAMP)
	$(BIN)/python -m datalane.demos.vlm

# Every file generated from the models (docs/recipe.md's reference, the CRD in crds/ and the
# chart's template of it, docs/operator.md's reference), in one command; tests/docs/test_generated.py
# fails naming this target when one of them drifts.
generate: $(STAMP)
	$(BIN)/python tools/generate.py

lint: $(STAMP)
	$(BIN)/ruff check datalane sidecar operator tests bench tools playground
	$(BIN)/mypy
	$(BIN)/lint-imports

# The fast tier for the edit loop: lint, types, import contracts, then every test of tests/ that
# carries no tier marker (pyproject.toml): no sidecar processes, no torchrun, no control plane,
# no containers, no fuzzers. A few minutes on 2 cores.
FAST := not slow and not cluster and not containers and not fuzz
check: lint
	$(BIN)/python -m pytest -q -m "$(FAST)"

# The test control plane (kube-apiserver, etcd, kwok, helm, the training-operator, Kubeflow
# Trainer v2 and JobSet) built from Go modules into ~/.cache/datalane/cluster: 17 min on a fresh,
# quiet 2-core machine (tools/cold_test.sh), longer under load; seconds once cached.
cluster:
	DATALANE_CLUSTER_TRAINER_V2=1 bash tests/cluster/build.sh

# The images (operator, sidecar, the tests' trainer) built with podman from a locally made
# Debian base (images/build.py), cached in podman's storage by a hash of their inputs:
# about 5 min on a fresh, quiet machine, seconds once cached. images/setup.sh first installs podman,
# buildah, runc and mmdebstrap where they are missing (as root, from Debian's packages).
# images/build.py needs only the standard library, so it runs before .venv exists.
images:
	bash images/setup.sh
	$(PY) images/build.py --tag e2e

# A local cluster for the README's "On a cluster" section (docs/playground.md): the control
# plane and the images from their caches (built when missing, as `make cluster` and
# `make images` do), Kubeflow's training-operator, an S3 server and a node whose pods really
# run in podman. Prints the KUBECONFIG line; `make playground-down` stops all of it.
playground: $(STAMP)
	bash images/setup.sh
	$(BIN)/python -m playground up

playground-down: $(STAMP)
	$(BIN)/python -m playground down

# Everything. On a cold machine the Go build (CPU) runs beside the pip install and the images'
# builds (mostly downloads), so the three take about as long as the Go build alone; each
# prefixes its lines ([cluster-build], [images]). The slowest tests are listed at the end.
test:
	$(MAKE) --no-print-directory -j3 setup cluster images
	$(MAKE) --no-print-directory lint
	$(BIN)/python -m pytest -q --durations=40

# Only the TrainJob tests (also part of `make test`): pods injected on the test control plane
# (tests/operator/test_trainjob_cluster.py), and a resize of a TrainJob whose pods really run,
# on `python -m playground up --trainer-v2` (tests/playground/test_trainjob_resize.py).
test-trainer-v2: $(STAMP) cluster images
	$(BIN)/python -m pytest -q -m trainer_v2

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

#!/usr/bin/env bash
# The wheels bench/device/run.sh needs on the lent GPU machine, downloaded here into .whl/.
#
#   bash bench/device/wheels.sh        # then call the device tool with carry [".whl"]
#
# The machine reaches no registry; its image has python3 3.12 with torch, numpy, pyarrow,
# tokenizers, fsspec, jinja2, pyyaml, prometheus-client, matplotlib (docs: .library/device/
# KINDS.md) but not TorchTitan and what TorchTitan 0.3.0 imports, zstandard, py-spy, and a
# grpcio/protobuf at least as new as the committed stubs. Versions are this repository's dev
# environment's. About 20 MB; .whl/ is ignored (.git/info/exclude) and travels by `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>"$(git rev-parse --git-path info/exclude)"
PIP=${PIP:-python3 -m pip}
mkdir -p .whl
$PIP download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl \
    torchtitan==0.3.0 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 \
    torchdata==0.11.0 spmd-types==0.2.3 datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 \
    einops==0.8.2 zstandard==0.25.0 grpcio==1.85.3 protobuf==7.36.2 py-spy==0.4.3
du -sh .whl
ls .whl

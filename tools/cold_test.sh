#!/usr/bin/env bash
# Time `make test` as a fresh machine runs it (what CI's `.ci/run` does on a new machine).
#
#   tools/cold_test.sh [DIR]     # DIR defaults to /tmp/datalane-cold-<time>
#
# A clean clone of HEAD runs `bash .ci/run` with a HOME of its own (so no pip, Go module, Go
# build or datalane cache: every wheel, module and image is fetched and built again) and a
# podman storage of its own (CONTAINERS_STORAGE_CONF: no image, no base). What it cannot make
# fresh: the Debian packages already installed (podman, buildah, runc, mmdebstrap: images/setup.sh
# installs them in well under a minute where they are missing) and the machine's Go and Python.
#
# Writes DIR/ci.log (each line stamped with the wall clock), DIR/load.log (the load average
# each minute: a cold time means something only on a quiet machine) and, last, DIR/summary.txt:
# the phases' ends and the total. The clone, HOME and storage (about 20 GB) are removed at
# the end unless COLD_KEEP=1.
set -euo pipefail
REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
DIR=${1:-/tmp/datalane-cold-$(date +%Y%m%d-%H%M%S)}
if [[ -e "$DIR" ]]; then
  echo "cold_test: $DIR exists; give a new folder" >&2
  exit 2
fi
mkdir -p "$DIR/home" "$DIR/containers" "$DIR/run"
git clone -q "$REPO" "$DIR/repo"
cat >"$DIR/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$DIR/containers"
runroot = "$DIR/run"
EOF

( while sleep 60; do echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; done ) >"$DIR/load.log" &
LOADER=$!
trap 'kill $LOADER 2>/dev/null || true' EXIT

# pyenv's shims find Python through PYENV_ROOT, which defaults to $HOME/.pyenv.
export PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"
stamp() { python3 -uc 'import sys, time
for line in sys.stdin: sys.stdout.write(time.strftime("%H:%M:%S ") + line)'; }
START=$(date +%s)
echo "cold_test: $(git -C "$DIR/repo" rev-parse --short HEAD) in $DIR, load $(cut -d' ' -f1-3 /proc/loadavg)"
set +e
(cd "$DIR/repo" && HOME="$DIR/home" CONTAINERS_STORAGE_CONF="$DIR/storage.conf" \
  bash .ci/run) 2>&1 | stamp >"$DIR/ci.log"
RC=${PIPESTATUS[0]}
set -e
END=$(date +%s)
{
  echo "commit $(git -C "$DIR/repo" rev-parse --short HEAD), rc $RC"
  echo "started $(date -d @"$START" +%T), total $(( END - START )) s ($(( (END - START) / 60 )) min)"
  echo "cluster built: $(grep -m1 'cluster-build\] .* done in ' "$DIR/ci.log" | cut -c1-8)"
  echo "images built: $(grep -m1 '\[images\] .* done in ' "$DIR/ci.log" | cut -c1-8)"
  echo "lint started: $(grep -m1 'ruff check' "$DIR/ci.log" | cut -c1-8)"
  echo "pytest started: $(grep -m1 'pytest -q' "$DIR/ci.log" | cut -c1-8)"
  echo "pytest: $(grep -E '^[0-9:]{8} [0-9]+ (passed|failed).* in [0-9.]+s' "$DIR/ci.log" | tail -n1 | cut -c10-)"
  echo "load: $(head -n1 "$DIR/load.log") ... $(tail -n1 "$DIR/load.log")"
} | tee "$DIR/summary.txt"
if [[ "${COLD_KEEP:-0}" != 1 ]]; then
  chmod -R u+w "$DIR/home" 2>/dev/null || true  # Go's module cache is read-only
  rm -rf "$DIR/repo" "$DIR/home" "$DIR/containers" "$DIR/run"
fi
exit "$RC"

#!/usr/bin/env bash
# Does one sidecar feed a GPU node? The device run of issue 19, in one script (< 8 minutes).
#
#   bash bench/device/run.sh          # on the lent GPU machine (16 cores, one H200): -> $OUT
#   bash bench/device/run.sh --cpu    # here, the CI size, no GPU (tests/bench/test_node_bench.py)
#
# Parts, each under its own time limit, each recorded in $OUT/summary.md whatever the others do:
#   1. titan    TorchTitan's own `torchtitan.train` on the GPU with datalane's dataloader
#               (bench/device/titan.py): 8 steps, then resumed from the step-4 checkpoint; every
#               step's global batch hash against datalane's own stream of the recipe on CPU,
#               and the same recipe trained by the CPU demo trainer (losses GPU vs CPU).
#               --cpu: the CPU trainer only, 4 steps resumed at 2.
#   2. workers  bench/workers.py: chat, 2 ranks flat out, the sidecar with 1 and then 2 rank
#               worker processes on CPUs 0-7 (the ranks on 8-15): the 1.8x target.
#               --cpu: --quick, unpinned.
#   3. scaling  bench/scaling.py on 1 and 14 cores with the sidecar's client on CPUs 14-15 of
#               its own (chat through the sidecar, its map stages on threads and in a map
#               process per core; G by py-spy at 1 core): the cost model's prediction against
#               what 14 cores measure.
#               --cpu: --quick on 1 and 2 cores, the Megatron path, in process and through a
#               sidecar with map processes.
#   4. feed     bench/feed.py: 8 ranks through one sidecar, the highest rate per rank each
#               recipe sustains with under 1% of steps waiting. --cpu: --quick, one rate.
#
# Offline: the machine reaches nothing. It runs the image's python3 (3.12, torch) with the
# packages the image lacks installed from wheels in .whl/, which bench/device/wheels.sh
# downloads here; the device call names .whl in `carry` (see docs/benchmarks.md, "Does one
# sidecar feed a GPU node?"). Results (8 files at most, as the device tool returns them):
# summary.md, log.txt, titan.md, workers.md, scaling.md, scaling.json, scaling.png, feed.md
# (feed.json and workers.json stay behind on the device; --cpu writes them to $OUT too).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
MODE=gpu
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; fi
OUT=${OUT:-$ROOT/bench/results/device-$MODE}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
START=$(date +%s)
# seconds for the whole script (the device: 8 minutes less the wheels); parts get what is left
if [[ $MODE == gpu ]]; then BUDGET=${BUDGET:-470}; else BUDGET=${BUDGET:-900}; fi
LOG=$OUT/log.txt
SUMMARY=$OUT/summary.md
: >"$LOG"
echo "# bench/device/run.sh ($MODE), $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(nproc) CPUs" >"$SUMMARY"

if [[ $MODE == gpu ]] && compgen -G ".whl/*.whl" >/dev/null; then  # the image's Python
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >>"$LOG" 2>&1 || echo "wheel install failed" >>"$SUMMARY"
    export PYTHONPATH=/tmp/site
    [[ -x /tmp/site/bin/py-spy ]] && export PYSPY=/tmp/site/bin/py-spy
fi
export PYTHONPATH=$ROOT:$ROOT/sidecar:$ROOT/operator${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/datalane-device-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# part NAME LIMIT OUTPUT_FILE CMD...: run CMD under the smaller of LIMIT and the time left,
# its output to OUTPUT_FILE (and the log); one line of the summary
part() {
    local name=$1 limit=$2 file=$3
    shift 3
    local left=$((BUDGET - ($(date +%s) - START)))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        echo "- $name: skipped, ${left}s left of the ${BUDGET}s budget" >>"$SUMMARY"
        return
    fi
    local t0=$(date +%s)
    echo "=== $name (limit ${limit}s): $*" >>"$LOG"
    timeout --kill-after=10 "$limit" "$@" 2>>"$LOG" | tee -a "$LOG" >"$file"
    local rc=${PIPESTATUS[0]}
    local took=$(($(date +%s) - t0))
    local verdict="exit $rc"
    ((rc == 124 || rc == 137)) && verdict="TIMED OUT after ${limit}s"
    echo "- $name: $verdict, ${took}s" >>"$SUMMARY"
}

{
    echo
    "$PY" - <<'EOF'
import os, platform
print(f"- python {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
try:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"- torch {torch.__version__}, {gpu}")
    import torchtitan
    print(f"- torchtitan {torchtitan.__version__}")
except Exception as e:  # the parts below say what fails
    print(f"- import failed: {type(e).__name__}: {e}")
EOF
    "$PY" -c 'import sys; sys.path.insert(0, "bench"); import scaling
print("- py-spy:", scaling.pyspy_binary() or "not found: G is not measured")'
    echo
} >>"$SUMMARY" 2>>"$LOG"

if [[ $MODE == gpu ]]; then
    part titan 150 "$OUT/titan.md" "$PY" bench/device/titan.py --devices cuda,cpu --steps 8 \
        --interval 4 --work "$WORK/titan" --timeout 120
    part corpus 60 "$WORK/corpus.txt" "$PY" bench/node_paths.py "$WORK/corpus"
    part workers 45 "$OUT/workers.md" "$PY" bench/workers.py --seconds 4 --warmup 5 \
        --workers 4 --sidecar-cpus 0,1,2,3,4,5,6,7 --rank-cpus 8,9,10,11,12,13,14,15 \
        --corpus "$WORK/corpus" --out "$WORK/workers.json"
    # two paths on 1 and 14 cores, the client on cores of its own as a trainer's is; windows
    # of 4 s (a window must span the read-ahead's cycles: 16 cores cycle faster than the
    # 2-core machine's 30 s windows need) after the fill (about 25 s on one core here: 20 on
    # the device's faster cores is a guess, and the 1-core rows say if it was short)
    part scaling 160 "$OUT/scaling.md" "$PY" bench/scaling.py --cores 1,14 \
        --client-cpus 14,15 --paths chat --modes sidecar,sidecar-mp --seconds 4 --warmup 3 \
        --fill-seconds 20 --machine-seconds 1 --corpus "$WORK/corpus" --out "$OUT"
    part feed 100 "$OUT/feed.md" "$PY" bench/feed.py --ranks 8 --search --seconds 2.5 \
        --warmup 1 --max-trials 4 --workers 4 --corpus "$WORK/corpus" --out "$WORK/feed.json"
else
    part titan 400 "$OUT/titan.md" "$PY" bench/device/titan.py --devices cpu --steps 4 \
        --interval 2 --work "$WORK/titan" --timeout 300
    part corpus 120 "$WORK/corpus.txt" "$PY" bench/node_paths.py "$WORK/corpus" --quick
    part workers 120 "$OUT/workers.md" "$PY" bench/workers.py --quick --corpus "$WORK/corpus" \
        --out "$OUT/workers.json"
    part scaling 300 "$OUT/scaling.md" "$PY" bench/scaling.py --quick --cores 1,2 \
        --paths megatron --modes inprocess,sidecar-mp --corpus "$WORK/corpus" --out "$OUT"
    part feed 200 "$OUT/feed.md" "$PY" bench/feed.py --quick --ranks 8 \
        --corpus "$WORK/corpus" --out "$OUT/feed.json"
fi

echo "- total $(($(date +%s) - START))s" >>"$SUMMARY"
cat "$SUMMARY"
# exit 1 if a part failed
! grep -qE '^- (titan|corpus|workers|scaling|feed): (exit [1-9]|TIMED OUT|skipped)' "$SUMMARY"

#!/usr/bin/env python3
"""Rank worker processes against one (issue 19): what a second sidecar process adds on chat.

    .venv/bin/python bench/workers.py --rounds 3                      # this machine (2 CPUs)
    .venv/bin/python bench/workers.py --kind map --rounds 3           # map processes, 1 vs 2
    .venv/bin/python bench/workers.py --sidecar-cpus 0,1,2,3,4,5,6,7 \\
        --rank-cpus 8,9,10,11,12,13,14,15                               # a 16-core node
    .venv/bin/python bench/workers.py --quick                         # the CI size

The sidecar's chat path holds its GIL for a fifth to a third of its work (the template
renderer, the loss mask's prefix renders: ``bench/scaling.py``), so one process stops near
``1 / G`` whatever its cores; ``--rank-processes N`` runs the ranks' sessions in N processes
with a GIL each. This runs ``bench/feed.py`` with 2 ranks on the chat recipe at ``--rate 1e9``
(each rank consumes flat out: "achieved per rank" is what the sidecar delivers) once per
``--processes`` value (default ``1,2``), alternated over ``--rounds``, and prints each one's
delivered tokens/s (median over the rounds), the sidecar's cores (its whole process tree) and
the ratio to the first value. The target is 2 processes >= 1.8x one - where the sidecar has
the cores for it: pin it (``--sidecar-cpus``) to more cores than one process can use and the
ranks elsewhere (``--rank-cpus``). On 2 CPUs the ranks' clients take the cores a second
process would use (docs/benchmarks.md: 1.05-1.1x there).

``--kind map`` compares map processes instead (``--map-processes N``, the sessions on threads
of the one sidecar process): 2 children render, parse and tokenize side by side where one
did alone.

Results: a markdown table on stdout and ``--out`` (JSON, every trial).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import feed  # noqa: E402

TARGET = 1.8  # 2 processes against 1 (issue 19)


def feed_trial(args: argparse.Namespace, processes: int, work: Path) -> dict[str, Any]:
    """One ``bench/feed.py`` trial of 2 ranks on chat, flat out, with ``processes`` rank
    worker processes (0: threads); its record."""
    out = work / f"feed-{processes}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, str(HERE / "feed.py"), "--ranks", str(args.ranks), "--recipes",
           "chat", "--rate", "1e9", "--seconds", str(args.seconds), "--warmup",
           str(args.warmup), "--workers", str(args.workers), f"--{args.kind}-processes",
           str(processes), "--out", str(out)]
    for flag in ("sidecar_cpus", "rank_cpus", "corpus"):
        if getattr(args, flag):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"feed.py with --{args.kind}-processes {processes} failed "
                         f"({proc.returncode}):\n{proc.stderr[-3000:]}")
    (trial,) = json.loads(out.read_text())["results"]["chat"]["trials"]
    return dict(trial)


def table(processes: list[int], trials: dict[int, list[dict[str, Any]]],
          kind: str = "rank") -> tuple[str, float]:
    """The markdown table and the ratio of the last value's median to the first's."""
    med = statistics.median
    first = med(t["achieved_per_rank"] for t in trials[processes[0]])
    lines = [f"| --{kind}-processes | delivered per rank, tokens/s (median) | each trial | "
             "sidecar tree, cores | against the first |", "|---:|---:|---|---:|---:|"]
    ratio = 1.0
    for n in processes:
        rates = [t["achieved_per_rank"] for t in trials[n]]
        ratio = med(rates) / first if first else float("nan")
        cores = [t["sidecar_cores"] for t in trials[n]]
        lines.append(f"| {n} | {med(rates):,.0f} | {' / '.join(f'{r:,.0f}' for r in rates)} | "
                     f"{min(cores):.2f}-{max(cores):.2f} | {ratio:.2f}x |")
    return "\n".join(lines), ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", default="1,2", help="the --rank-processes (or "
                                                       "--map-processes) values, compared "
                                                       "with the first")
    ap.add_argument("--kind", choices=("rank", "map"), default="rank",
                    help="rank worker processes, or map processes")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=8.0, help="counted window per trial")
    # past the read-ahead's fill (about 12 s on 2 cores: docs/benchmarks.md), which delivers
    # less than the sidecar makes while it banks work ahead
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--workers", type=int, default=2, help="map workers per process")
    ap.add_argument("--sidecar-cpus", default="", help="pin the sidecar, e.g. 0,1,2,3")
    ap.add_argument("--rank-cpus", default="", help="pin the ranks' processes")
    ap.add_argument("--quick", action="store_true", help="CI size: tiny corpus, short trials")
    ap.add_argument("--corpus", type=Path, help="corpus folder (default ~/.cache/datalane/...)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "workers.json")
    args = ap.parse_args()
    if args.quick:  # (what feed.py's --quick sets)
        args.seconds, args.warmup = 1.0, 1.0
    try:
        processes = [int(p) for p in args.processes.split(",")]
    except ValueError:
        raise SystemExit(f"--processes {args.processes!r}: not a comma list of integers") from None
    if not processes or min(processes) < 0:
        raise SystemExit(f"--processes {args.processes!r}: give counts of 0 (threads) or more")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_start = os.getloadavg()[0]
    trials: dict[int, list[dict[str, Any]]] = {n: [] for n in processes}
    with tempfile.TemporaryDirectory(prefix="datalane-workers-") as work:
        for r in range(args.rounds):
            for n in processes if r % 2 == 0 else processes[::-1]:  # alternated
                trials[n].append(feed_trial(args, n, Path(work)))
    text, ratio = table(processes, trials, args.kind)
    print(f"{feed.header(started, load_start)}; chat, {args.ranks} ranks flat out, "
          f"{args.seconds:g} s counted after {args.warmup:g} s, {args.rounds} round(s), "
          f"sidecar --workers {args.workers}{feed.pinning(args)}\n")
    print(text)
    print(f"\n--{args.kind}-processes {processes[-1]} against {processes[0]}: {ratio:.2f}x (the "
          f"target for 2 against 1: {TARGET}x, where the sidecar has the cores)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"started": started, "kind": args.kind,
                                    "processes": processes,
                                    "ratio": ratio, "trials": trials,
                                    "args": {k: str(v) for k, v in vars(args).items()}},
                                   indent=1))


if __name__ == "__main__":
    main()

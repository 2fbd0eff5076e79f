#!/usr/bin/env python3
"""`make bench`: datalane against its peers on the issue-2 recipe, in one run.

1. Makes the corpus of ``bench/make_corpus.py`` (cached in ~/.cache/datalane, keyed by the
   generator's content).
2. Interleaves ``--rounds`` rounds of: raw ``encode_batch_fast`` (the ceiling), datalane with
   1 and 2 workers, Zephon 0.2.0 with ``max_workers`` 2 and 4 (its best is kept). Each run is a
   fresh process; the medians are reported, with ratios computed from the same run.
3. Resume point size, restore-to-first-batch time and tokens lost, for datalane and Zephon.

Zephon runs in its own virtualenv (``.venv-peers``, made by ``make bench``) so its pins cannot
touch the project's. Results are printed and written to ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_PY = ROOT / ".venv-peers" / "bin" / "python"


def _corpus(docs: int) -> Path:
    maker = HERE / "make_corpus.py"
    key = hashlib.sha256(maker.read_bytes()).hexdigest()[:12]
    out = Path.home() / ".cache" / "datalane" / f"bench-corpus-{docs}-{key}"
    if not (out / "MANIFEST.json").exists():
        print(f"making the benchmark corpus in {out} ...", file=sys.stderr)
        subprocess.run([sys.executable, str(maker), str(out), "--docs", str(docs)], check=True)
    return out


def _json_lines(cmd: list[str]) -> list[dict]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-zephon", action="store_true", help="skip the Zephon peer")
    args = ap.parse_args()
    corpus = str(_corpus(args.docs))
    zephon = not args.no_zephon and PEERS_PY.exists()
    py = sys.executable
    runs: dict[str, list[float]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        jobs = [
            [py, str(HERE / "peers" / "raw_tokenizers.py"), "--corpus", corpus],
            [py, str(HERE / "datalane_bench.py"), "throughput", "--corpus", corpus,
             "--workers", "1"],
            [py, str(HERE / "datalane_bench.py"), "throughput", "--corpus", corpus,
             "--workers", "2"],
        ]
        if zephon:
            jobs.append([str(PEERS_PY), str(HERE / "peers" / "zephon_bench.py"), "--corpus",
                         corpus, "--only", "throughput", "--max-workers", "2,4"])
        for cmd in jobs:
            for rec in _json_lines(cmd):
                if "tokens_per_s" in rec and rec.get("measure") != "throughput_best":
                    runs.setdefault(rec["name"], []).append(rec["tokens_per_s"])
    med = {name: statistics.median(v) for name, v in runs.items()}
    raw = med["raw_encode_batch_fast"]
    best_dl = max(v for k, v in med.items() if k.startswith("datalane"))
    zephon_best = max((v for k, v in med.items() if k.startswith("zephon")), default=None)
    extra = _json_lines([py, str(HERE / "datalane_bench.py"), "restore", "--corpus", corpus])
    zextra = (_json_lines([str(PEERS_PY), str(HERE / "peers" / "zephon_bench.py"), "--corpus",
                           corpus, "--only", "loss,restore"]) if zephon else [])
    print(f"\nthroughput, median of {args.rounds} interleaved rounds (tokens/s):")
    for name, v in sorted(med.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<32} {v:>12,.0f}   {v / raw:6.1%} of raw")
    print(f"datalane best / raw encode_batch_fast = {best_dl / raw:.3f}   (target >= 0.95)")
    if zephon_best:
        print(f"datalane best / Zephon best        = {best_dl / zephon_best:.2f}x  (target >= 2x)")
    print("\nresume, restore, loss:")
    for rec in extra + zextra:
        if "tokens_per_s" not in rec:
            print("  " + json.dumps(rec))
    result = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "docs": args.docs, "rounds": args.rounds,
              "throughput_median": med, "runs": runs, "other": extra + zextra}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "latest.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

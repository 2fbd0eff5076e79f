#!/usr/bin/env python3
"""Many streams through one sidecar, checkpointing, with Health probed throughout (issue 23).

``--ranks`` data-parallel ranks x ``--readers`` readers each (TP peers: ``--ranks`` x
``--readers`` streams, default 64 x 1) read through one real sidecar on a Unix socket
(``--ranks-per-pod`` = ``--ranks``, a ``file://`` store) and every reader calls
``checkpoint()`` every ``--every`` steps. A prober calls Health every 0.1 s with a 5 s deadline
(a kubelet's probe). Printed: Health latency p50/p99/max and failures, checkpoint latency
p50/p99/max, failed readers, wall time. A sidecar with too few server threads shows Health
timeouts and checkpoints that hang (64 threads: 48 ranks checkpointing every 10 steps timed
out 53 of 59 probes).

Usage: bench/streams.py [--ranks 64] [--readers 1] [--steps 24] [--every 4] [--max-streams 0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import grpc
import yaml

from datalane.client import SidecarLoader
from datalane.corpus import make_corpus
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--max-streams", type=int, default=0)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="datalane-streams-")
    corpus = make_corpus(os.path.join(folder, "corpus"), web_docs=2000)
    recipe = os.path.join(folder, "recipe.yaml")
    with open(recipe, "w") as f:
        yaml.safe_dump({"lanes": args.ranks, "global_batch_size": args.ranks, "seq_len": 128,
                        "seed": 7, "tokenizer": {"uri": corpus.tokenizer},
                        "sources": [{"name": "web", "uris": [corpus.web], "epochs": None,
                                     "chunk_rows": 20}]}, f)
    sock = os.path.join(folder, "dl.sock")
    cmd = [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", sock, "--recipe",
           recipe, "--store", os.path.join(folder, "store"), "--ranks-per-pod",
           str(args.ranks), "--workers", "2"]
    if args.max_streams:
        cmd += ["--max-streams", str(args.max_streams)]
    with open(os.path.join(folder, "sidecar.log"), "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    health: list[float] = []
    health_failures: list[str] = []
    checkpoints: list[float] = []
    failed: list[str] = []
    stop = threading.Event()

    def probe() -> None:
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = pbg.DataLaneStub(channel)
            stub.Health(pb.HealthRequest(), timeout=120, wait_for_ready=True)
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    stub.Health(pb.HealthRequest(), timeout=5)
                    health.append(time.monotonic() - t0)
                except grpc.RpcError as e:
                    health_failures.append(e.code().name)
                stop.wait(0.1)

    def reader(rank: int, k: int) -> None:
        try:
            with SidecarLoader(sock, rank=rank, world_size=args.ranks, microbatch_size=1,
                               readers=args.readers, reader=k, transport="inline",
                               open_timeout=120) as loader:
                it = iter(loader)
                for n in range(args.steps):
                    next(it)
                    if (n + 1) % args.every == 0:
                        t0 = time.monotonic()
                        loader.checkpoint(timeout=300)
                        checkpoints.append(time.monotonic() - t0)
        except BaseException:
            failed.append(f"rank {rank} reader {k}: {traceback.format_exc(limit=2)}")

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=reader, args=(r, k), daemon=True)
               for r in range(args.ranks) for k in range(args.readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    wall = time.monotonic() - t0
    stop.set()
    prober.join(30)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    print(json.dumps({
        "streams": args.ranks * args.readers, "steps": args.steps, "every": args.every,
        "health_probes": len(health) + len(health_failures),
        "health_failures": len(health_failures),
        "health_s": {"p50": _pct(health, 0.5), "p99": _pct(health, 0.99),
                     "max": _pct(health, 1.0)},
        "checkpoints": len(checkpoints),
        "checkpoint_s": {"p50": _pct(checkpoints, 0.5), "p99": _pct(checkpoints, 0.99),
                         "max": _pct(checkpoints, 1.0),
                         "mean": round(statistics.mean(checkpoints), 4) if checkpoints
                         else None},
        "failed_readers": len(failed), "wall_s": round(wall, 1),
        "load": round(os.getloadavg()[0], 1)}), flush=True)
    for f in failed[:3]:
        print(f, file=sys.stderr)


if __name__ == "__main__":
    main()

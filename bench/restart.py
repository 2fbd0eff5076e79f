#!/usr/bin/env python3
"""Sidecar restart to the trainer's next batch, early and late in the stream (issue 4).

A real sidecar serves one trainer (``SidecarLoader``, shm transport) on the benchmark recipe
of ``bench/make_corpus.py`` with repeat-forever data; at a chosen step the sidecar is
killed with SIGKILL and started again. Reported: seconds from launching the new sidecar
process to the trainer holding its next microbatch (process start, planning, the client's
reconnect, re-opening at the exact position with a bounded replay, the first batch), and
that the batch is the one an uninterrupted run yields there.

Usage: bench/restart.py --corpus DIR [--at 3,200,1000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import yaml

from datalane.client import InProcessLoader, SidecarLoader
from datalane.spec.recipe import load_recipe


def _recipe(corpus: str, folder: str) -> str:
    path = os.path.join(folder, "recipe.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({
            "lanes": 2, "global_batch_size": 8, "seq_len": 2048, "seed": 1234,
            "tokenizer": {"uri": os.path.join(corpus, "tokenizer", "tokenizer.json")},
            "sources": [{"name": "web", "uris": [os.path.join(corpus, "web", "*.parquet")],
                         "epochs": None}],
            "shuffle": {"block_size": 1024}}, f)
    return path


def _start(sock: str, recipe: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
                             sock, "--recipe", recipe, "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(corpus: str, at: int) -> dict:
    folder = tempfile.mkdtemp(prefix="datalane-restart-")
    recipe = _recipe(corpus, folder)
    sock = os.path.join(folder, "dl.sock")
    proc = _start(sock, recipe)
    loader = SidecarLoader(sock, rank=0, world_size=1, microbatch_size=4, open_timeout=120)
    it = iter(loader)
    for _ in range(2 * at):  # two microbatches per step
        next(it)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    launched = {}

    def relaunch() -> None:
        launched["t"] = time.perf_counter()
        launched["proc"] = _start(sock, recipe)

    timer = threading.Timer(0.2, relaunch)
    timer.start()
    batch = next(it)
    took = time.perf_counter() - launched["t"]
    loader.close()
    launched["proc"].send_signal(signal.SIGTERM)
    launched["proc"].wait()
    want = None
    for i, b in enumerate(InProcessLoader(load_recipe(recipe), 0, 1, 4)):
        if i == 2 * at:
            want = b
            break
    assert want is not None
    same = bool(np.array_equal(want.input_ids, batch.input_ids))
    return {"name": "sidecar_restart_to_next_batch", "step": at, "seconds": round(took, 3),
            "identical": same, "reconnects": loader.reconnects}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--at", default="3,200,1000")
    args = ap.parse_args()
    for at in (int(v) for v in args.at.split(",")):
        print(json.dumps(measure(args.corpus, at)), flush=True)


if __name__ == "__main__":
    main()

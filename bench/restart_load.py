#!/usr/bin/env python3
"""A graceful sidecar restart under load, trainers checkpointing every step (issue 23).

``--ranks`` trainer ranks (threads, one ``SidecarLoader`` each; the pod's ``--ranks-per-pod``)
read through a real sidecar with a checkpoint store and call ``checkpoint()`` at every step
boundary, while ``--hogs`` processes spin beside them (a loaded node). At a random point the
sidecar gets SIGTERM (kubelet's, on every eviction and restart), drains, exits, and is started
again. Reported per round: seconds from launching the new process to each rank's next
microbatch, the sidecar's own breakdown (its start's laps from the ``serving`` log line, each
Open's session build and ledger, the first microbatch after an Open) and the client's
(``SidecarLoader.last_resume``: waiting for the socket, connect, open, first microbatch).

Usage: bench/restart_load.py [--rounds 5] [--ranks 2] [--hogs 3] [--pace 0.02] [--signal TERM]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from datalane.client import SidecarLoader
from datalane.corpus import make_corpus


def _hog() -> None:
    while True:
        pass


class Rank(threading.Thread):
    """One trainer rank: reads, "trains" ``pace`` seconds per microbatch, checkpoints every
    step; records when each microbatch arrived."""

    def __init__(self, sock: str, rank: int, world: int, pace: float) -> None:
        super().__init__(daemon=True)
        self.loader = SidecarLoader(sock, rank=rank, world_size=world, microbatch_size=1,
                                    open_timeout=120, reconnect_timeout=300)
        self.pace = pace
        self.arrived: list[float] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            for batch in self.loader:
                self.arrived.append(time.monotonic())
                time.sleep(self.pace)
                if batch.index + 1 == self.loader.per_step:
                    self.loader.checkpoint(timeout=300)
                if self.stop.is_set():
                    break
        except BaseException as e:
            self.error = e
        finally:
            self.loader.close()

    def first_after(self, t: float, wait: float) -> float | None:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and self.error is None:
            later = [a for a in self.arrived[-64:] if a > t]
            if later:
                return later[0] - t
            time.sleep(0.01)
        return None


def _start(sock: str, recipe: str, store: str, ranks: int, log: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "datalane_sidecar", "serve", "--socket",
                                 sock, "--recipe", recipe, "--store", store, "--ranks-per-pod",
                                 str(ranks), "--workers", "2"], stdout=f, stderr=f)


def _log_lines(log: str, since: int) -> tuple[list[dict[str, Any]], int]:
    with open(log, "rb") as f:
        f.seek(since)
        data = f.read()
    out = []
    for line in data.decode(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out, since + len(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--hogs", type=int, default=3)
    ap.add_argument("--pace", type=float, default=0.02)
    ap.add_argument("--signal", choices=["TERM", "KILL"], default="TERM")
    ap.add_argument("--seed", type=int, default=23)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="datalane-restart-load-")
    corpus = make_corpus(os.path.join(folder, "corpus"))
    sock, store = os.path.join(folder, "dl.sock"), os.path.join(folder, "store")
    log = os.path.join(folder, "sidecar.log")
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    rng = random.Random(args.seed)
    proc = _start(sock, corpus.recipe, store, args.ranks, log)
    ranks = [Rank(sock, r, args.ranks, args.pace) for r in range(args.ranks)]
    for r in ranks:
        r.start()
    offset = 0
    results = []
    try:
        for n in range(args.rounds):
            target = len(ranks[0].arrived) + rng.randint(8, 40)
            while len(ranks[0].arrived) < target and ranks[0].error is None:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.2))
            signalled = time.monotonic()
            proc.send_signal(getattr(signal, f"SIG{args.signal}"))
            proc.wait(120)
            launched = time.monotonic()
            proc = _start(sock, corpus.recipe, store, args.ranks, log)
            firsts = [r.first_after(launched, 300) for r in ranks]
            time.sleep(0.5)  # the last log lines of the round
            lines, offset = _log_lines(log, offset)
            serving = [x for x in lines if x.get("msg") == "serving"]
            opens = [x["seconds"] for x in lines if x.get("msg") == "session opened"]
            first = [x for x in lines if x.get("msg") == "first microbatch sent"]
            result = {"round": n, "exit_after_signal": round(launched - signalled, 3),
                      "first_microbatch_after_launch": [
                          None if f is None else round(f, 3) for f in firsts],
                      "startup": serving[-1]["startup_seconds"] if serving else None,
                      "serving_after_start": serving[-1]["since_start"] if serving else None,
                      "opens": opens,
                      "first_sent_after_open": [x["seconds_after_open"] for x in first],
                      "client": [r.loader.last_resume for r in ranks],
                      "load": os.getloadavg()[0]}
            results.append(result)
            print(json.dumps(result), flush=True)
            if any(r.error for r in ranks):
                break
    finally:
        for r in ranks:
            r.stop.set()
        for r in ranks:
            r.join(60)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        for h in hogs:
            h.terminate()
    errors = [repr(r.error) for r in ranks if r.error is not None]
    worst = [max(f for f in x["first_microbatch_after_launch"] if f is not None)
             for x in results if any(f is not None for f in x["first_microbatch_after_launch"])]
    print(json.dumps({"rounds": len(results), "errors": errors,
                      "worst_rank_first_microbatch_s": {
                          "median": round(statistics.median(worst), 3) if worst else None,
                          "max": round(max(worst), 3) if worst else None},
                      "sidecar_log": log}), flush=True)


if __name__ == "__main__":
    main()

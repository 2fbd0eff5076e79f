"""The chaos run shared by the chaos tests: two ranks stream through a real sidecar with a
store and checkpoint every few steps, while the sidecar is killed (SIGKILL) or stopped
(SIGTERM: kubelet's, on every eviction and restart) at random points - some of them while
rank 0 is inside ``checkpoint()`` - and started again; with rank worker processes
(``--rank-processes``), a rank's worker is killed (SIGKILL) while the server goes on. The run
must end with the uninterrupted run's microbatches and step hashes, and the store's ledger
must audit clean from the first committed step to the last."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datalane import load_recipe
from datalane.client import SidecarLoader
from datalane.spec.hashing import global_hash
from datalane.store import CheckpointStore
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from tests.sidecar.test_edges import _reference, _same, _step_hashes

PER_STEP = 4  # B = 16, world 2, microbatch 2
PACE = 0.03  # seconds of "training" per microbatch
KINDS = ("kill9", "sigterm", "kill9-in-checkpoint", "sigterm-in-checkpoint", "kill9-worker",
         "kill9-worker-in-checkpoint")


def kill9_worker(socket: str, rng: random.Random) -> int:
    """SIGKILL one rank worker process of the sidecar on ``socket`` (its pids are in the
    Stats reply); returns the pid."""
    import grpc

    with grpc.insecure_channel(f"unix://{os.path.abspath(socket)}") as channel:
        reply = pbg.DataLaneStub(channel).Stats(pb.StatsRequest(), timeout=30)
    workers = json.loads(reply.json)["rank_workers"]
    pid = int(workers[rng.choice(sorted(workers))]["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


def run_chaos(sidecar: Callable[..., Any], recipe_path: str, tmp_path: Path, *, steps: int,
              every: int, faults: list[str], seed: int, within: int | None = None,
              flags: tuple[str, ...] = ()) -> None:
    """Run ``steps`` steps on 2 ranks checkpointing every ``every`` steps, with ``faults``
    (each one of :data:`KINDS`) at random points of the first ``within`` steps (default: all
    but the last two; a trainer drains what a stopped sidecar sent, up to a ring of
    microbatches, so it goes on while the sidecar restarts); assert the stream, the hashes,
    the store. ``flags``: more sidecar flags (``--rank-processes 2`` for the worker faults)."""
    assert all(f in KINDS for f in faults)
    store_uri = str(tmp_path / "store")
    sc = sidecar(recipe_path, "--store", store_uri, "--ranks-per-pod", "2", *flags)
    recipe = load_recipe(recipe_path)
    got: dict[int, list[Any]] = {0: [], 1: []}
    errors: list[str] = []
    in_checkpoint = threading.Event()  # rank 0 is inside checkpoint()
    # the ranks hold before their last two steps until every fault landed: a trainer drains
    # what a stopped sidecar sent while it restarts, and could otherwise finish first
    faults_done = threading.Event()

    def rank(r: int) -> None:
        try:
            loader = SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                                   transport="shm" if r == 0 else "inline",
                                   reconnect_timeout=300)
            it = iter(loader)
            for n in range(steps * PER_STEP):
                if n == (steps - 2) * PER_STEP:
                    faults_done.wait(900)
                b = next(it)
                time.sleep(PACE)  # a trainer's step takes time: the faults land mid-run
                got[r].append(b.copy())
                if (n + 1) % (every * PER_STEP) == 0:
                    if r == 0:
                        in_checkpoint.set()
                    try:
                        saved = loader.checkpoint(timeout=300)
                    finally:
                        in_checkpoint.clear()
                    assert saved["step"] == (n + 1) // PER_STEP
            loader.close()
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    rng = random.Random(seed)
    faults = faults[:]
    rng.shuffle(faults)
    # each fault at a random point of the run: once rank 0 has read that many microbatches
    points = sorted(rng.sample(range(4, (within or steps - 2) * PER_STEP), len(faults)))
    for fault, point in zip(faults, points, strict=True):
        while len(got[0]) < point and threads[0].is_alive():
            time.sleep(0.005)
        if fault.endswith("in-checkpoint"):
            in_checkpoint.wait(60)  # the next checkpoint rank 0 asks for (before the hold)
        time.sleep(rng.uniform(0, 0.2 if not fault.endswith("in-checkpoint") else 0.05))
        if fault.startswith("kill9-worker"):
            kill9_worker(sc.socket, rng)  # the server goes on: nothing to start
            continue
        if fault.startswith("kill9"):
            sc.kill9()
        else:
            assert sc.terminate() == 0
        sc.start()
    remaining = threads[0].is_alive()
    faults_done.set()
    for t in threads:
        t.join(900)
    assert not errors, "\n".join(errors)
    assert remaining, "the run ended before the faults did: make it longer"
    for r in (0, 1):
        _same(got[r], _reference(recipe, r, 2, 2, steps * PER_STEP))
    # the per-step global hash, composed from the two ranks' lane digests
    reference = _step_hashes(recipe, steps)
    for s in range(steps):
        last = s * PER_STEP + PER_STEP - 1
        digests = {**got[0][last].lane_digests, **got[1][last].lane_digests}
        assert global_hash(digests[k] for k in sorted(digests)) == reference[s]
    store = CheckpointStore(store_uri)
    report = store.audit()
    assert report.ok, report.text()
    committed = store.committed_steps()
    assert committed[-1] == steps
    ledger: dict[int, str] = {}
    for step in committed:
        ledger.update(dict(store.manifest(step).ledger))
    # every step up to the last checkpoint has its hash in the ledger, equal to the reference
    first = min(ledger)
    assert sorted(ledger) == list(range(first, steps))
    assert ledger == {s: reference[s] for s in range(first, steps)}

"""The chaos run shared by the chaos tests: ranks stream through a real sidecar with a store
and checkpoint every few steps, while the sidecar is killed (SIGKILL) or stopped (SIGTERM:
kubelet's, on every eviction and restart) at random points - some of them while rank 0 is
inside ``checkpoint()`` - and started again; with rank worker processes
(``--rank-processes``), a rank's worker is killed (SIGKILL) while the server goes on; with map
processes (``--map-processes``), one of them is killed (SIGKILL) and replaced. A run
may go on in a world of another size (``resize``): new trainers resume from the store's last
committed step, under more faults. The run must end with the uninterrupted run's microbatches
(every column, the per-image ones of a vision recipe included) and step hashes, the store's
last checkpoint must count the documents an uninterrupted run counts, and its ledger must
audit clean from the first committed step to the last."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from datalane import load_recipe
from datalane.client import SidecarLoader
from datalane.engine.loader import Loader
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.state import Checkpoint
from datalane.store import CheckpointStore
from tests.sidecar.test_edges import _reference, _same
from tests.sidecar.test_rank_processes import _stats

MICROBATCH = 2  # sequences a microbatch, on every rank
PACE = 0.03  # seconds of "training" per microbatch
KINDS = ("kill9", "sigterm", "kill9-in-checkpoint", "sigterm-in-checkpoint", "kill9-worker",
         "kill9-worker-in-checkpoint", "kill9-map", "kill9-map-in-checkpoint")


@dataclass(frozen=True)
class Phase:
    """``steps`` steps on ``world`` ranks with ``faults`` (each one of :data:`KINDS`) at random
    points of its first ``within`` steps (None: all but the last two)."""

    world: int
    steps: int
    faults: list[str] = field(default_factory=list)
    within: int | None = None


def kill9_worker(socket: str, rng: random.Random) -> int:
    """SIGKILL one rank worker process of the sidecar on ``socket`` (its pids are in the
    Stats reply); returns the pid."""
    workers = _stats(socket)["rank_workers"]
    pid = int(workers[rng.choice(sorted(workers))]["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


def kill9_map(socket: str, rng: random.Random) -> int:
    """SIGKILL one map process of the sidecar on ``socket`` (the Stats reply lists them: the
    server's, or each rank worker's), waiting for one to be running; returns the pid."""
    deadline = time.monotonic() + 60
    while True:
        stats = _stats(socket)
        listed = stats.get("map_processes", []) + [
            m for w in stats.get("rank_workers", {}).values() for m in w.get("map_processes", [])]
        pids = sorted(m["pid"] for m in listed if m["pid"])
        if pids:
            pid = rng.choice(pids)
            os.kill(pid, signal.SIGKILL)
            return pid
        assert time.monotonic() < deadline, f"no map process is running: {stats}"
        time.sleep(0.05)


def run_chaos(sidecar: Callable[..., Any], recipe_path: str, tmp_path: Path, *, steps: int,
              every: int, faults: list[str], seed: int, within: int | None = None,
              flags: tuple[str, ...] = (), resize: Phase | None = None) -> None:
    """Run ``steps`` steps on 2 ranks checkpointing every ``every`` steps, with ``faults``
    (each one of :data:`KINDS`) at random points of the first ``within`` steps (default: all
    but the last two; a trainer drains what a stopped sidecar sent, up to a ring of
    microbatches, so it goes on while the sidecar restarts); then, with ``resize``, the pod is
    replaced by one of that phase's world (SIGTERM, ``--ranks-per-pod`` its world size) and
    that phase's trainers resume from the last committed step. Assert the stream, the hashes, the
    documents counted, the store. ``flags``: more sidecar flags (``--rank-processes 2`` for the
    worker faults, ``--map-processes`` for the map process faults)."""
    store_uri = str(tmp_path / "store")
    sc = sidecar(recipe_path, "--store", store_uri, "--ranks-per-pod", "2", *flags)
    recipe = load_recipe(recipe_path)
    rng = random.Random(seed)
    phases = [Phase(2, steps, faults, within), *([resize] if resize is not None else [])]
    reference, counted = _uninterrupted(recipe, sum(p.steps for p in phases))
    first = 0
    for phase in phases:
        if first:  # a world of another size: its pods are new, with that many ranks each
            assert sc.terminate() == 0
            sc.args[sc.args.index("--ranks-per-pod") + 1] = str(phase.world)
            sc.start()
        got = _phase(sc, recipe, phase, first, every, rng)
        per_step = recipe.global_batch_size // (phase.world * MICROBATCH)
        end = first + phase.steps
        for r in range(phase.world):
            want = _reference(recipe, r, phase.world, MICROBATCH, end * per_step)
            _same_columns(got[r], want[first * per_step:])
        # the per-step global hash, composed from the ranks' lane digests
        for s in range(phase.steps):
            last = s * per_step + per_step - 1
            digests = {k: v for r in range(phase.world) for k, v in
                       got[r][last].lane_digests.items()}
            assert global_hash(digests[k] for k in sorted(digests)) == reference[first + s]
        first = end
    store = CheckpointStore(store_uri)
    report = store.audit()
    assert report.ok, report.text()
    committed = store.committed_steps()
    assert committed[-1] == first
    # the last checkpoint counts every record read, document kept and token emitted, as an
    # uninterrupted run does: nothing lost, nothing read twice
    lanes = store.load(first).lanes
    assert {k: s.counters.encode() for k, s in lanes.items()} == counted
    ledger: dict[int, str] = {}
    for step in committed:
        ledger.update(dict(store.manifest(step).ledger))
    # every step up to the last checkpoint has its hash in the ledger, equal to the reference
    low = min(ledger)
    assert sorted(ledger) == list(range(low, first))
    assert ledger == {s: reference[s] for s in range(low, first)}


def _phase(sc: Any, recipe: Any, phase: Phase, first: int, every: int,
           rng: random.Random) -> dict[int, list[Any]]:
    """The microbatches each rank of ``phase`` read, from step ``first`` on (a resume from the
    store's checkpoint of ``first`` when it is not 0), with the phase's faults."""
    assert all(f in KINDS for f in phase.faults)
    world, steps = phase.world, phase.steps
    per_step = recipe.global_batch_size // (world * MICROBATCH)
    assert per_step * world * MICROBATCH == recipe.global_batch_size
    got: dict[int, list[Any]] = {r: [] for r in range(world)}
    errors: list[str] = []
    in_checkpoint = threading.Event()  # rank 0 is inside checkpoint()
    # the ranks hold before their last two steps until every fault landed: a trainer drains
    # what a stopped sidecar sent while it restarts, and could otherwise finish first
    faults_done = threading.Event()

    def rank(r: int) -> None:
        try:
            loader = SidecarLoader(sc.socket, rank=r, world_size=world,
                                   microbatch_size=MICROBATCH,
                                   transport="shm" if r == 0 else "inline",
                                   reconnect_timeout=300, resume_step=first or None)
            it = iter(loader)
            for n in range(steps * per_step):
                if n == (steps - 2) * per_step:
                    faults_done.wait(900)
                b = next(it)
                time.sleep(PACE)  # a trainer's step takes time: the faults land mid-run
                got[r].append(b.copy())
                if (n + 1) % (every * per_step) == 0:
                    if r == 0:
                        in_checkpoint.set()
                    try:
                        saved = loader.checkpoint(timeout=300)
                    finally:
                        in_checkpoint.clear()
                    assert saved["step"] == first + (n + 1) // per_step
            loader.close()
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    faults = phase.faults[:]
    rng.shuffle(faults)
    # each fault at a random point of the run: once rank 0 has read that many microbatches
    points = sorted(rng.sample(range(4, (phase.within or steps - 2) * per_step), len(faults)))
    for fault, point in zip(faults, points, strict=True):
        while len(got[0]) < point and threads[0].is_alive():
            time.sleep(0.005)
        if fault.endswith("in-checkpoint"):
            in_checkpoint.wait(60)  # the next checkpoint rank 0 asks for (before the hold)
        time.sleep(rng.uniform(0, 0.2 if not fault.endswith("in-checkpoint") else 0.05))
        if fault.startswith("kill9-worker"):
            kill9_worker(sc.socket, rng)  # the server goes on: nothing to start
            continue
        if fault.startswith("kill9-map"):
            kill9_map(sc.socket, rng)  # its thread starts another: nothing to start
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
    assert remaining or not faults, "the run ended before the faults did: make it longer"
    return got


def _same_columns(got: list[Any], want: list[Any]) -> None:
    """The microbatches are the reference's, column for column and byte for byte (a vision
    recipe's per-image columns too), the same images in all."""
    _same(got, want)
    for a, b in zip(got, want, strict=True):
        assert list(a.columns) == list(b.columns)
        for name in b.columns:
            assert a.columns[name].dtype == b.columns[name].dtype, (a.step, name)
            assert np.array_equal(a.columns[name], b.columns[name]), (a.step, a.index, name)
    if "image_seq" in want[0].columns:
        images = sum(len(b.columns["image_seq"]) for b in want)
        assert images > 0 and sum(len(a.columns["image_seq"]) for a in got) == images


def _uninterrupted(recipe: Any, steps: int) -> tuple[dict[int, str], dict[int, list[Any]]]:
    """An uninterrupted in-process run of ``steps`` steps on one rank: every step's global
    hash, and each lane's counters after the last (encoded)."""
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        it = iter(loader)
        hashes = {}
        for _ in range(steps):
            step = next(it)
            hashes[step.step] = step.global_hash()
        ckpt = Checkpoint.from_json(loader.state_dict())
    return hashes, {k: s.counters.encode() for k, s in ckpt.lanes.items()}

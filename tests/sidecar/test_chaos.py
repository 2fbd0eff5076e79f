"""Chaos: 10 kill -9 and 5 SIGTERM of a sidecar at random points while two ranks stream and
checkpoint every few steps. The run must end with the uninterrupted run's step hashes, and
the store's ledger must audit clean from the first committed step to the last."""

from __future__ import annotations

import random
import threading
import time
import traceback
from typing import Any

import pytest

from datalane import load_recipe
from datalane.client import SidecarLoader
from datalane.spec.hashing import global_hash
from datalane.store import CheckpointStore
from tests.sidecar.test_edges import _reference, _same, _step_hashes

STEPS = 64
EVERY = 4  # checkpoint at every 4th step boundary
FAULTS = ["kill9"] * 10 + ["sigterm"] * 5
PACE = 0.03  # seconds of "training" per microbatch


@pytest.mark.slow
def test_kill9_and_sigterm_at_random_points_change_nothing(sidecar, repeat_recipe,
                                                           tmp_path) -> None:
    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "2")
    recipe = load_recipe(repeat_recipe)
    per_step = 4  # B = 16, world 2, microbatch 2
    got: dict[int, list[Any]] = {0: [], 1: []}
    errors: list[str] = []

    def rank(r: int) -> None:
        try:
            loader = SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                                   transport="shm" if r == 0 else "inline",
                                   reconnect_timeout=120)
            it = iter(loader)
            for n in range(STEPS * per_step):
                b = next(it)
                time.sleep(PACE)  # a trainer's step takes time: the faults land mid-run
                got[r].append(b.copy())
                if (n + 1) % (EVERY * per_step) == 0:
                    saved = loader.checkpoint(timeout=300)
                    assert saved["step"] == (n + 1) // per_step
            loader.close()
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    rng = random.Random(20261201)
    faults = FAULTS[:]
    rng.shuffle(faults)
    # each fault at a random point of the run: once rank 0 has read that many microbatches
    points = sorted(rng.sample(range(4, (STEPS - 2) * per_step), len(faults)))
    for fault, point in zip(faults, points, strict=True):
        while len(got[0]) < point and threads[0].is_alive():
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.2))
        if fault == "kill9":
            sc.kill9()
        else:
            assert sc.terminate() == 0
        sc.start()
    remaining = threads[0].is_alive()
    for t in threads:
        t.join(600)
    assert not errors, "\n".join(errors)
    assert remaining, "the run ended before the faults did: make it longer"
    for r in (0, 1):
        _same(got[r], _reference(recipe, r, 2, 2, STEPS * per_step))
    # the per-step global hash, composed from the two ranks' lane digests
    reference = _step_hashes(recipe, STEPS)
    for s in range(STEPS):
        digests = {**got[0][s * per_step + 3].lane_digests,
                   **got[1][s * per_step + 3].lane_digests}
        assert global_hash(digests[k] for k in sorted(digests)) == reference[s]
    store = CheckpointStore(store_uri)
    report = store.audit()
    assert report.ok, report.text()
    committed = store.committed_steps()
    assert committed[-1] == STEPS
    ledger: dict[int, str] = {}
    for step in committed:
        ledger.update(dict(store.manifest(step).ledger))
    # every step up to the last checkpoint has its hash in the ledger, equal to the reference
    first = min(ledger)
    assert sorted(ledger) == list(range(first, STEPS))
    assert ledger == {s: reference[s] for s in range(first, STEPS)}

"""A step's lane digests are hashed behind it, of the bytes it delivered.

``Loader.next_step`` returns a step before its windows are hashed: the loader's hashing
thread hashes private copies of them while the caller uses the step (and the next step
packs), and reading ``step.lane_digests`` waits for it. So the digests must be those of the
windows as they were delivered whatever the caller writes into the step's arrays meanwhile,
equal to :func:`window_digest` of each lane's rows, and never more than one step behind:
the next ``next_step`` returns only once the step before it is hashed.
"""

from __future__ import annotations

import threading

import numpy as np

from datalane import Knobs, Loader
from datalane.spec.hashing import window_digest


def test_digests_are_of_the_delivered_bytes_whatever_the_caller_writes(make_recipe) -> None:
    recipe = make_recipe(lanes=4, global_batch_size=8)
    rows = recipe.lane_batch
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader, \
            Loader(recipe, 0, 1, Knobs(workers=2)) as reference:
        for _ in range(3):
            gate = threading.Event()
            loader._hasher().submit(gate.wait)  # the hashing thread waits for the caller
            try:
                step = loader.next_step()  # (the step before is hashed: it returns)
                want = reference.next_step()
                assert all(np.array_equal(step.columns[k], want.columns[k])
                           for k in step.columns)
                delivered = {k: a.copy() for k, a in step.columns.items()}
                for a in step.columns.values():  # the caller reuses the arrays at once
                    a[:] = 7
            finally:
                gate.set()
            for k, lane in enumerate(sorted(step.lane_digests)):
                window = {n: a[k * rows:(k + 1) * rows] for n, a in delivered.items()}
                assert step.lane_digests[lane] == window_digest(loader.schema, window), (
                    f"step {step.step} lane {lane}: the digest must be of the window as it "
                    f"was delivered, not of the arrays the caller changed afterwards")
            assert dict(step.lane_digests) == dict(want.lane_digests)


def test_the_next_step_waits_for_the_last_ones_digests(make_recipe) -> None:
    recipe = make_recipe(lanes=2, global_batch_size=4)
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        first = loader.next_step()
        gate = threading.Event()
        loader._hasher().submit(gate.wait)  # behind the first step's windows
        try:
            second = loader.next_step()
            resolved = first.lane_digests._digests  # type: ignore[attr-defined]
            assert resolved is not None and len(resolved) == 2, (
                "next_step must return only once the step before it is hashed (at most one "
                "step is hashed behind the caller)")
        finally:
            gate.set()
        assert len(dict(second.lane_digests)) == 2

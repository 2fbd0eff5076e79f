"""Pod checkpoints (:class:`~datalane_sidecar.checkpoints.PodCheckpoints`) against a store
that records its calls and fails or hangs on demand.

The pod has two ranks (world size 2 of a 4-lane recipe: rank 0 holds lanes 0-1, rank 1 lanes
2-3), each sending its real lane states (a loader's checkpoint JSON); what the store is asked
to write and commit, and what each rank gets back, are checked call by call.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from datalane_sidecar.checkpoints import STORE_SECONDS, PodCheckpoints, Saved

from datalane.engine.loader import Loader
from datalane.spec.errors import MismatchError, StorageError
from datalane.spec.state import Checkpoint
from tests.sidecar.inproc import tiny_recipe

D0 = {3: {0: b"a" * 32, 1: b"b" * 32}, 4: {0: b"c" * 32, 1: b"d" * 32}}  # rank 0's ledger
D1 = {3: {2: b"e" * 32, 3: b"f" * 32}, 4: {2: b"g" * 32, 3: b"h" * 32}}  # rank 1's


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """Rank -> its checkpoint JSON (world size 2, at the start)."""
    recipe = tiny_recipe(tmp_path_factory.mktemp("docs"))
    out = {}
    for rank in (0, 1):
        loader = Loader(recipe, rank, 2)
        out[rank] = json.dumps(loader.state_dict(), separators=(",", ":"))
        loader.close()
    return out


class _Store:
    """Records write_pod and commit; ``fail`` (an error) or ``hang`` (an Event to wait for)
    apply to write_pod, ``committed`` to is_committed."""

    uri = "mem://ckpt"

    def __init__(self) -> None:
        self.writes: list[tuple[int, str, dict[int, Any], dict[int, dict[int, bytes]]]] = []
        self.commits: list[int] = []
        self.asked: list[int] = []
        self.fail: BaseException | None = None
        self.hang: threading.Event | None = None
        self.committed: bool | BaseException = False
        self.manifest: object | None = "manifest"
        self.commit_fails: BaseException | None = None  # once

    def pod_uri(self, step: int, pod: str) -> str:
        return f"{self.uri}/step-{step}/pod-{pod}.json"

    def is_committed(self, step: int) -> bool:
        self.asked.append(step)
        if isinstance(self.committed, BaseException):
            raise self.committed
        return self.committed

    def write_pod(self, step: int, pod: str, lanes: dict[int, Any],
                  digests: dict[int, dict[int, bytes]], fingerprint: str,
                  doc: dict[str, Any] | None, lanes_total: int) -> str:
        assert fingerprint and lanes_total == 4
        if self.hang is not None:
            self.hang.wait(30)
        if self.fail is not None:
            raise self.fail
        self.writes.append((step, pod, dict(lanes), digests))
        return self.pod_uri(step, pod)

    def commit(self, step: int) -> object | None:
        self.commits.append(step)
        if self.commit_fails is not None:
            error, self.commit_fails = self.commit_fails, None
            raise error
        return self.manifest


def _in_thread(fn: Callable[[], Saved]) -> tuple[threading.Thread, dict[str, Saved]]:
    out: dict[str, Saved] = {}
    # a daemon: a slip that leaves a rank waiting must not keep the test process alive
    t = threading.Thread(target=lambda: out.setdefault("saved", fn()), daemon=True)
    t.start()
    return t, out


def _lanes(states: dict[int, str], *ranks: int) -> dict[int, Any]:
    lanes: dict[int, Any] = {}
    for r in ranks:
        lanes.update(Checkpoint.from_json(json.loads(states[r])).lanes)
    return lanes


def test_without_a_store_a_checkpoint_only_returns() -> None:
    pods = PodCheckpoints(None, "p", 2)
    assert pods.save(5, "a", "not even JSON", {}) == Saved(5)
    assert STORE_SECONDS == 30.0 and pods.store_seconds == 30.0


def test_the_pod_object_is_written_once_both_ranks_asked(states) -> None:
    store = _Store()
    pods = PodCheckpoints(store, "p", 2)
    first, out = _in_thread(lambda: pods.save(5, "a", states[0], D0, timeout=20))
    first.join(0.3)
    assert first.is_alive() and store.writes == [] and store.asked == [5]
    mine = pods.save(5, "b", states[1], D1)
    first.join(10)
    want = Saved(5, "mem://ckpt/step-5/pod-p.json", True)
    assert mine == want and out["saved"] == want
    # one object: every lane of the pod, each step's digests merged across the ranks
    assert len(store.writes) == 1
    step, pod, lanes, digests = store.writes[0]
    assert (step, pod, lanes) == (5, "p", _lanes(states, 0, 1))
    assert digests == {s: {**D0[s], **D1[s]} for s in (3, 4)}
    assert store.commits == [5] and pods.last_step == 5
    # a later step's first rank does not ask the store whether it was committed before
    t, _ = _in_thread(lambda: pods.save(6, "a", states[0], {}, timeout=20))
    pods.save(6, "b", states[1], {})
    t.join(10)
    assert store.asked == [5] and store.commits == [5, 6]
    assert list(pods._pending) == [6]  # step 5's wait is dropped once 6 is written


def test_a_commit_that_makes_no_manifest_is_not_committed(states) -> None:
    store = _Store()
    store.manifest = None
    pods = PodCheckpoints(store, "p", 1)
    assert pods.save(5, "a", states[0], {}) == Saved(5, "mem://ckpt/step-5/pod-p.json", False)


def test_a_step_committed_before_is_confirmed_for_one_rank_alone(states) -> None:
    store = _Store()
    store.committed = True
    pods = PodCheckpoints(store, "p", 2)
    saved = pods.save(5, "a", states[0], D0)  # the other rank went on past it: no wait
    assert saved == Saved(5, "mem://ckpt/step-5/pod-p.json", True)
    # its own lanes, no ledger: the store checks them against the committed object
    assert store.writes == [(5, "p", _lanes(states, 0), {})] and store.commits == [5]
    assert store.asked == [5] and pods.last_step is None


def test_a_store_that_cannot_tell_counts_as_not_committed(states) -> None:
    store = _Store()
    store.committed = StorageError("throttled", transient=True)
    pods = PodCheckpoints(store, "p", 2)
    saved = pods.save(5, "a", states[0], D0, timeout=0.2)
    assert saved.error is not None and not saved.from_store
    assert str(saved.error) == ("step 5: 1 of 2 ranks of pod p asked for a checkpoint within "
                                "0 s")
    assert isinstance(saved.error, TimeoutError) and store.writes == []


@pytest.mark.parametrize("storage", [True, False])
def test_a_confirmation_the_store_refuses_names_the_object(states, storage) -> None:
    store = _Store()
    store.committed = True
    store.fail = (StorageError("gone", transient=True) if storage
                  else MismatchError("lane 0 differs"))
    pods = PodCheckpoints(store, "p", 2)
    saved = pods.save(5, "a", states[0], D0)
    assert saved.step == 5 and saved.from_store is storage and not saved.committed
    if storage:
        assert str(saved.error) == ("pod p's object mem://ckpt/step-5/pod-p.json in the "
                                    "checkpoint store mem://ckpt: gone")
        assert isinstance(saved.error, StorageError) and saved.error.transient
        assert saved.error.__cause__ is store.fail
    else:
        assert saved.error is store.fail  # not the store's: unchanged


def test_a_failed_write_is_reported_and_written_again_when_asked_again(states) -> None:
    store = _Store()
    store.fail = StorageError("disk full", transient=False)
    pods = PodCheckpoints(store, "p", 1)
    saved = pods.save(5, "a", states[0], D0)
    assert saved.from_store and not saved.committed and saved.object == ""
    assert str(saved.error) == ("pod p's object mem://ckpt/step-5/pod-p.json in the "
                                "checkpoint store mem://ckpt: disk full")
    assert isinstance(saved.error, StorageError) and not saved.error.transient
    assert pods._pending[5].written == 0 and pods.last_step is None
    store.fail = None
    assert pods.save(5, "a", states[0], D0) == Saved(5, "mem://ckpt/step-5/pod-p.json", True)
    assert len(store.writes) == 1 and pods.last_step == 5


def test_an_error_that_is_not_the_stores_is_passed_on_unchanged(states) -> None:
    store = _Store()
    store.fail = ValueError("bad lanes")
    pods = PodCheckpoints(store, "p", 1)
    saved = pods.save(5, "a", states[0], {})
    assert saved.error is store.fail and not saved.from_store


def test_a_store_that_hangs_fails_the_checkpoint_within_the_bound(states) -> None:
    store = _Store()
    store.hang = threading.Event()
    pods = PodCheckpoints(store, "p", 1, store_seconds=0.5)
    t0 = time.monotonic()
    saved = pods.save(5, "a", states[0], {}, timeout=30)
    took = time.monotonic() - t0
    store.hang.set()
    assert 0.4 < took < 5
    assert saved.from_store and isinstance(saved.error, StorageError) and saved.error.transient
    assert str(saved.error) == (
        "the checkpoint store mem://ckpt did not answer within 0.5 s while pod p's object of "
        "step 5 (mem://ckpt/step-5/pod-p.json) was written and committed; the store may be "
        "down or unreachable")


def test_a_rank_past_ranks_per_pod_rewrites_the_object_with_every_lane(states) -> None:
    store = _Store()
    pods = PodCheckpoints(store, "p", 1)
    assert pods.save(5, "a", states[0], D0).committed
    assert pods.save(5, "a", states[0], D0).committed  # the same rank again: nothing new
    assert len(store.writes) == 1
    assert pods.save(5, "b", states[1], D1).committed
    assert [w[2] for w in store.writes] == [_lanes(states, 0), _lanes(states, 0, 1)]


def test_abort_ends_every_wait_with_a_transient_error(states) -> None:
    store = _Store()
    pods = PodCheckpoints(store, "p", 2)
    t, out = _in_thread(lambda: pods.save(5, "a", states[0], D0, timeout=20))
    t.join(0.3)
    pods.abort("the sidecar is stopping")
    t.join(10)
    assert not t.is_alive()
    error = out["saved"].error
    assert isinstance(error, StorageError) and error.transient
    assert str(error) == "step 5: the sidecar is stopping; ask again"
    assert not out["saved"].from_store and store.writes == []


def test_only_a_steps_first_rank_asks_the_store_whether_it_was_committed(states) -> None:
    store = _Store()
    pods = PodCheckpoints(store, "p", 3)
    waiting = [_in_thread(lambda sid=sid: pods.save(5, sid, states[0], D0, timeout=20))
               for sid in ("a", "b")]
    for t, _ in waiting:
        t.join(0.3)
    assert store.asked == [5]  # rank b is not the first: the store is not asked again
    pods.save(5, "c", states[1], D1)
    for t, out in waiting:
        t.join(10)
        assert out["saved"].committed
    assert store.asked == [5] and len(store.writes) == 1


def test_a_failed_commit_writes_the_object_again_when_asked_again(states) -> None:
    """The object was written but the commit failed: asking again writes and commits again
    (the earlier error is not the answer to the new request)."""
    store = _Store()
    store.commit_fails = StorageError("throttled", transient=True)
    pods = PodCheckpoints(store, "p", 1)
    saved = pods.save(5, "a", states[0], D0)
    assert str(saved.error) == ("pod p's object mem://ckpt/step-5/pod-p.json in the "
                                "checkpoint store mem://ckpt: throttled")
    assert pods.save(5, "a", states[0], D0) == Saved(5, "mem://ckpt/step-5/pod-p.json", True)
    assert len(store.writes) == 2 and store.commits == [5, 5]


def test_a_write_asked_again_is_waited_for_not_answered_by_the_last_failure(states) -> None:
    store = _Store()
    store.fail = StorageError("disk full")
    pods = PodCheckpoints(store, "p", 1)
    assert pods.save(5, "a", states[0], D0).error is not None
    store.fail, store.hang = None, threading.Event()
    threading.Timer(0.3, store.hang.set).start()
    assert pods.save(5, "a", states[0], D0) == Saved(5, "mem://ckpt/step-5/pod-p.json", True)


def test_abort_answers_a_write_asked_again_with_its_own_error(states) -> None:
    store = _Store()
    store.fail = StorageError("disk full")
    pods = PodCheckpoints(store, "p", 1)
    assert pods.save(5, "a", states[0], D0).error is not None
    store.fail, store.hang = None, threading.Event()
    try:
        t, out = _in_thread(lambda: pods.save(5, "a", states[0], D0))
        t.join(0.3)
        pods.abort("stopping")
        t.join(10)
        assert str(out["saved"].error) == "step 5: stopping; ask again"
    finally:
        store.hang.set()


def test_a_rank_asking_during_a_hung_write_waits_only_what_is_left_of_the_bound(
        states) -> None:
    """The store's bound runs from the start of the write: a request made 1.2 s into a
    write bounded at 2 s fails about 0.8 s later, not 2 s later."""
    store = _Store()
    store.hang = threading.Event()
    pods = PodCheckpoints(store, "p", 1, store_seconds=2.0)
    try:
        _in_thread(lambda: pods.save(5, "a", states[0], D0))
        time.sleep(1.2)
        t0 = time.monotonic()
        saved = pods.save(5, "a", states[0], D0)
        assert time.monotonic() - t0 < 1.6
        assert saved.from_store and "did not answer within 2 s" in str(saved.error)
    finally:
        store.hang.set()

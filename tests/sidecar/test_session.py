"""A :class:`~datalane_sidecar.session.Session` driven in the test's own process.

A tiny endless recipe (4 lanes, a global batch of 8 sequences of 32 tokens): at world size 1
with microbatches of 4 a step is 2 microbatches. Every microbatch, boundary and digest is
compared with a plain :class:`~datalane.engine.loader.Loader` run of the same recipe; the
refusals are checked by their messages. No sidecar process: each test takes about a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from datalane_sidecar.session import Session

from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import ConfigError, StorageError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe
from datalane.spec.state import Checkpoint
from datalane.wire.layout import Layout
from datalane.wire.shm import ShmReader
from tests.sidecar.inproc import tiny_recipe

MB = 4  # microbatch size: 8 sequences a step at world size 1 are 2 microbatches


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    return tiny_recipe(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def plan(recipe: Recipe) -> Plan:
    return Plan.build(recipe)


@pytest.fixture(scope="module")
def reference(recipe: Recipe) -> dict[str, Any]:
    """Six steps of the plain loader at world size 1: each step's microbatches (input_ids
    bytes), lane digests, trained tokens, and the checkpoint JSON before each step."""
    loader = Loader(recipe, 0, 1)
    out: dict[str, Any] = {"ids": {}, "digests": {}, "tokens": {}, "real": {}, "states": {}}
    try:
        for s in range(6):
            out["states"][s] = json.dumps(loader.state_dict(), separators=(",", ":"))
            step = loader.next_step()
            out["ids"][s] = [step.microbatch(i, MB).columns["input_ids"].tobytes()
                             for i in range(2)]
            out["digests"][s] = step.lane_digests
            out["tokens"][s] = step.step_tokens
            out["real"][s] = int((step.positions >= 0).sum())
        out["states"][6] = json.dumps(loader.state_dict(), separators=(",", ":"))
    finally:
        loader.close()
    return out


@pytest.fixture
def open_session(plan: Plan) -> Iterator[Callable[..., Session]]:
    """``open_session(**overrides)``: a session of rank 0 of 1 from the start, prefetch 4."""
    pool = TaskPool(1)
    made: list[Session] = []

    def make(**kw: Any) -> Session:
        args: dict[str, Any] = dict(session_id="s", plan=plan, pool=pool,
                                    knobs=Knobs(workers=1), rank=0, world_size=1,
                                    microbatch_size=MB, start=None, skip_microbatches=0,
                                    prefetch=4)
        args.update(kw)
        made.append(Session(**args))
        return made[-1]

    yield make
    for s in made:
        s.close()
    pool.shutdown()


def _settle(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _checkpoint(text: str) -> Checkpoint:
    return Checkpoint.from_json(json.loads(text))


def _lanes(text: str) -> dict[int, str]:
    """The lane -> compact JSON of a checkpoint text, as Session.attach expects them."""
    return {int(k): json.dumps(v, separators=(",", ":"))
            for k, v in json.loads(text)["lanes"].items()}


def _hold_step_1(monkeypatch: pytest.MonkeyPatch, then: BaseException | None = None,
                 step: int = 1) -> threading.Event:
    """Make every loader hold its step 1 (or ``step``) until the returned event is set (then
    raise ``then``, if given): the producer is caught computing boundary 2."""
    release = threading.Event()
    real = Loader.next_step

    def held(self: Loader) -> Any:
        if self.step == step:
            assert release.wait(30)
            if then is not None:
                raise then
        return real(self)

    monkeypatch.setattr(Loader, "next_step", held)
    return release


# -- refusals ---------------------------------------------------------------------------------

def test_a_session_without_readers_is_refused(open_session) -> None:
    with pytest.raises(ConfigError, match=r"^a session needs at least one reader, got 0$"):
        open_session(readers=0)


def test_a_skip_of_a_whole_step_is_refused_naming_both(open_session) -> None:
    with pytest.raises(ConfigError, match=r"^skip_microbatches 2 must be below the 2 "
                                          r"microbatches of a step$"):
        open_session(skip_microbatches=2)


def test_an_eval_session_at_or_past_its_steps_is_refused(open_session, reference) -> None:
    start = _checkpoint(reference["states"][2])
    with pytest.raises(ConfigError, match=r"^step 2 is past the 2 steps of eval stream 'ev'; "
                                          r"an evaluation opens it from the start$"):
        open_session(start=start, stream="ev", steps=2)
    session = open_session(start=start, stream="ev", steps=3)  # one step left: served
    assert session.first_step == 2 and session.is_eval


# -- the stream -------------------------------------------------------------------------------

def test_the_microbatches_are_the_loaders_and_the_last_of_a_step_carries_its_end(
        open_session, reference) -> None:
    session = open_session()
    assert (session.per_step, session.first_step, session.lanes) == (2, 0, range(0, 4))
    assert not session.is_eval and session.lost is None and session.stream == "train"
    gen = session.claim(0)
    assert gen == 1 and session.attached() == [0]
    got = [session.next(0, gen, 5.0) for _ in range(6)]
    for k, item in enumerate(got):
        assert item is not None
        s, i = divmod(k, 2)
        assert (item.step, item.index, item.rows) == (s, i, MB)
        assert item.columns["input_ids"].tobytes() == reference["ids"][s][i]
        assert item.step_tokens == reference["tokens"][s]
        assert item.nbytes == sum(a.nbytes for a in item.columns.values())
        if i == 1:  # the step's last: the boundary after it and the step's digests
            assert item.after is not None and item.after.step == s + 1
            assert session.texts.text(item.after) == reference["states"][s + 1]
            assert item.lane_digests == reference["digests"][s]
        else:
            assert item.after is None and item.lane_digests == {}
    assert session.digests_between(0, 3) == {s: reference["digests"][s] for s in range(3)}
    assert session.digests_between(1, 2) == {1: reference["digests"][1]}
    # the producer counted the real (not padded) tokens of every step it made
    made = session.loader.step
    assert session.produced_tokens == sum(reference["real"][s] for s in range(made))


def test_a_skip_starts_at_that_microbatch_of_the_first_step(open_session, reference) -> None:
    session = open_session(skip_microbatches=1)
    gen = session.claim(0)
    first = session.next(0, gen, 5.0)
    second = session.next(0, gen, 5.0)
    assert first is not None and second is not None
    assert [(first.step, first.index), (second.step, second.index)] == [(0, 1), (1, 0)]
    assert first.columns["input_ids"].tobytes() == reference["ids"][0][1]


def test_nobody_reading_the_producer_stops_prefetch_ahead(open_session) -> None:
    session = open_session(prefetch=3)
    _settle(lambda: session.queue_depth() == 3, "3 microbatches made")
    time.sleep(0.3)  # room for a fourth, had the bound slipped
    assert session.queue_depth() == 3 and session.queue_depth(0) == 3
    # 3 microbatches: steps 0 and 1 computed, boundaries 0, 1 and 2 recorded
    assert session.kept_boundaries()["count"] == 3
    info = session.describe()
    assert (info["next_step"], info["first_step"], info["queue_depth"]) == (2, 0, 3)
    assert info["lanes"] == [0, 4] and info["readers"] == 1 and info["attached"] == []
    assert info["acked"] is None and info["stream"] == "train"
    assert info["reader_positions"] == [{"attached": False, "sent": None, "acked": None,
                                         "ready": 3}]
    gauges = session.gauges()
    assert gauges["step"] == 2 and len(gauges["mixture_tokens"]) == 1


def test_a_reader_that_waits_for_nothing_gets_none_at_once(open_session) -> None:
    session = open_session(prefetch=1)
    gen = session.claim(0)
    _settle(lambda: session.queue_depth(0) == 1, "1 microbatch made")
    assert session.next(0, gen, 0.0) is not None
    t0 = time.monotonic()
    assert session.next(0, gen + 1, 0.5) is None  # a stale generation takes nothing
    assert time.monotonic() - t0 < 0.45  # and is woken at once: its slot is another's


# -- readers and positions --------------------------------------------------------------------

def test_sent_and_acked_positions_are_the_slowest_readers(open_session) -> None:
    session = open_session(readers=2)
    g0, g1 = session.claim(0), session.claim(1)
    assert session.sent is None and session.acked is None
    session.sent_to(0, g0, (1, 1))
    session.sent_to(1, g1, (0, 1))
    session.sent_to(1, g1 + 1, (5, 0))  # another generation's: ignored
    assert session.sent == (0, 1)
    session.acked_by(0, g0, (1, 0))
    session.acked_by(1, g1, (0, 1))
    session.acked_by(1, g1 + 1, (4, 0))  # ignored
    assert session.acked == (0, 1)
    positions = session.reader_positions()
    assert [(p["attached"], p["sent"], p["acked"]) for p in positions] == [
        (True, [1, 1], [1, 0]), (True, [0, 1], [0, 1])]
    assert session.describe()["acked"] == [0, 1]
    # acknowledged 1 and 2 microbatches: the fanout counts them from the session's start
    assert [s.acked for s in session._fanout.slots] == [2, 1]
    session.detach(1, g1)
    assert session.attached() == [0]


def test_a_reader_attaches_where_the_session_holds_its_lane_states(open_session,
                                                                   reference) -> None:
    session = open_session(readers=2, prefetch=4)
    g0 = session.claim(0)
    for _ in range(4):  # reader 0 reads 2 steps: boundaries 0-2 recorded
        assert session.next(0, g0, 5.0) is not None
    one = _lanes(reference["states"][1])
    # refusals: a reader or a skip out of range, a boundary not held, other lane states
    assert session.attach(2, 1, one, 0) is None
    assert session.attach(-1, 1, one, 0) is None
    assert session.attach(1, 1, one, 2) is None
    assert session.attach(1, 1, one, -1) is None
    assert session.attach(1, 9, one, 0) is None
    assert session.attach(1, 0, one, 0) is None  # step 0's states are not step 1's
    assert session.attach(1, 1, {**one, 0: "{}"}, 0) is None
    # step 1, microbatch 1: item 3 of the session; the reader's position is set to it
    gen = session.attach(1, 1, one, 1)
    assert gen == 1
    assert session.reader_positions()[1]["acked"] == [1, 1]
    item = session.next(1, gen, 5.0)
    assert item is not None and (item.step, item.index) == (1, 1)
    assert item.columns["input_ids"].tobytes() == reference["ids"][1][1]
    assert session.attach(1, 1, one, 1) == 2  # again: a new generation


def test_an_attach_before_a_skipped_start_is_refused(open_session, reference) -> None:
    session = open_session(readers=2, skip_microbatches=1)
    assert session.attach(1, 0, _lanes(reference["states"][0]), 0) is None
    assert session.attach(1, 0, _lanes(reference["states"][0]), 1) == 1


def test_an_attach_waits_for_the_boundary_being_computed(open_session, reference,
                                                        monkeypatch) -> None:
    """Step 1 is held in the loader until released: boundary 2 is the one being computed
    (the producer has room), so an attach there waits for it; boundary 3 is not next, and
    an attach without a wait does not wait."""
    release = _hold_step_1(monkeypatch)
    session = open_session(prefetch=4)
    session.claim(0)
    _settle(lambda: session.queue_depth() == 2, "step 0 made")
    two, three = _lanes(reference["states"][2]), _lanes(reference["states"][3])
    try:
        t0 = time.monotonic()
        assert session.attach(0, 3, three, 0, wait=20.0) is None
        assert session.attach(0, 2, two, 0) is None
        assert time.monotonic() - t0 < 2.0  # neither waited
        threading.Timer(0.1, release.set).start()
        assert session.attach(0, 2, two, 0, wait=0.9) == 2  # a short wait is a wait too
        assert time.monotonic() - t0 >= 0.1
    finally:
        release.set()


# -- boundaries and digests -------------------------------------------------------------------

def test_state_at_gives_the_boundary_text_or_says_why_not(open_session, reference) -> None:
    session = open_session(prefetch=2)
    gen = session.claim(0)
    assert session.state_at(0) == reference["states"][0]
    assert session.state_at(1, timeout=20) == reference["states"][1]
    with pytest.raises(ConfigError, match=r"^step 9 was not reached within 0 s$"):
        session.state_at(9, timeout=0.2)
    for _ in range(4):
        assert session.next(0, gen, 5.0) is not None
    _settle(lambda: 3 in session.digests, "step 3 made")
    session.forget_before(2)
    assert session.kept_boundaries()["count"] >= 2
    assert min(session._boundaries) == 2 and min(session.digests) == 2
    assert session.state_at(2) == reference["states"][2]
    with pytest.raises(ConfigError, match=r"^step 1 is no longer held by the session \(it "
                                          r"keeps boundaries from step 2 on\); checkpoint at "
                                          r"the current step$"):
        session.state_at(1, timeout=5)
    session.close()
    with pytest.raises(StorageError, match=r"^the session of rank 0 closed before step 9 was "
                                           r"reached; open one at your position and ask "
                                           r"again$") as e:
        session.state_at(9, timeout=5)
    assert e.value.transient


def test_forget_before_keeps_the_boundaries_a_slower_reader_may_attach_at(
        open_session, reference) -> None:
    session = open_session(readers=2, prefetch=4)
    g0, g1 = session.claim(0), session.claim(1)
    for _ in range(4):  # reader 0 reads 2 steps, reader 1 one step, nobody acknowledges
        assert session.next(0, g0, 5.0) is not None
    for _ in range(2):
        assert session.next(1, g1, 5.0) is not None
    _settle(lambda: 3 in session.digests, "step 3 computed")
    session.forget_before(2)  # the trainer checkpointed step 2
    # item 0 is still held (held for a re-attach): boundaries from step 0 on stay
    assert min(session._boundaries) == 0 and min(session.digests) == 2
    session.acked_by(0, g0, (2, 0))
    session.acked_by(1, g1, (2, 0))
    session.detach(1, g1)
    session.forget_before(2)
    assert min(session._boundaries) == 2


def test_a_finite_stream_ends_once_its_reader_was_sent_every_step(open_session,
                                                                  reference) -> None:
    session = open_session(stream="ev", steps=2)
    gen = session.claim(0)
    assert not session.exhausted(0)
    got = []
    t0 = time.monotonic()
    while (item := session.next(0, gen, 5.0)) is not None:
        got.append((item.step, item.index))
    assert time.monotonic() - t0 < 4.0  # the end wakes the reader: no timeout waited out
    assert got == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _settle(lambda: session.done, "done")
    assert session.exhausted(0) and session.loader.step == 2


def test_a_producer_error_reaches_the_reader_after_what_was_made(open_session,
                                                                 monkeypatch) -> None:
    calls = {"n": 0}
    real = Loader.next_step

    def fails_second(self: Loader) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk gone")
        return real(self)

    monkeypatch.setattr(Loader, "next_step", fails_second)
    session = open_session(stream="ev", steps=3)
    gen = session.claim(0)
    assert [(i.step, i.index) for i in (session.next(0, gen, 5.0) for _ in range(2))
            if i is not None] == [(0, 0), (0, 1)]
    t0 = time.monotonic()
    with pytest.raises(OSError, match="disk gone"):
        session.next(0, gen, 5.0)
    assert time.monotonic() - t0 < 4.0  # the error wakes the reader
    assert not session.exhausted(0)


# -- backfill ---------------------------------------------------------------------------------

def test_backfill_rebuilds_the_digests_before_the_sessions_start(open_session, reference,
                                                                 caplog) -> None:
    session = open_session(start=_checkpoint(reference["states"][3]))
    assert session.first_step == 3
    with caplog.at_level(logging.INFO, "datalane.sidecar"):
        session.backfill(1, lambda: _checkpoint(reference["states"][1]))
        assert session.backfilled.wait(20)
    assert "ledger of steps 1-2 rebuilt for rank 0" in caplog.text
    assert session.digests_between(0, 3) == {1: reference["digests"][1],
                                             2: reference["digests"][2]}
    assert list(session.digests)[:2] == [1, 2]  # the oldest first
    # nothing to rebuild from the session's own step or later, or from the start
    session.backfill(3, lambda: pytest.fail("not loaded"))
    assert session.backfilled.is_set()


def test_a_backfill_that_does_not_land_on_the_start_keeps_no_digest(
        open_session, reference, caplog) -> None:
    session = open_session(start=_checkpoint(reference["states"][3]))
    with caplog.at_level(logging.WARNING, "datalane.sidecar"):
        session.backfill(1, lambda: _checkpoint(reference["states"][0]))  # not step 1's
        assert session.backfilled.wait(20)
    assert session.digests_between(0, 3) == {}
    assert ("cannot rebuild the ledger of steps 1-2 for rank 0: replaying lane 0 from the "
            "checkpoint of step 1 does not reach the state this session started from at "
            "step 3") in caplog.text


@pytest.mark.parametrize("fails", ["pool", "loader"])
def test_a_backfill_whose_pool_or_loader_cannot_be_made_still_ends(
        open_session, reference, monkeypatch, caplog, fails) -> None:
    """A rebuild that cannot start (no thread left for its pool, a loader that refuses)
    fails like any other rebuild: logged, no digest kept, ``backfilled`` set, so the worker
    that waits for it (datalane_sidecar.worker) and the first checkpoint go on."""
    from datalane_sidecar import session as session_module

    session = open_session(start=_checkpoint(reference["states"][3]))
    made: list[TaskPool] = []

    class Pool(TaskPool):
        def __init__(self, *args: Any) -> None:
            if fails == "pool":
                raise RuntimeError("can't start new thread")
            super().__init__(*args)
            made.append(self)

    def no_loader(*args: Any, **kw: Any) -> Loader:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(session_module, "TaskPool", Pool)
    if fails == "loader":
        monkeypatch.setattr(session_module, "Loader", no_loader)
    with caplog.at_level(logging.WARNING, "datalane.sidecar"):
        session.backfill(1, lambda: pytest.fail("not loaded"))
        assert session.backfilled.wait(20)
    assert ("cannot rebuild the ledger of steps 1-2 for rank 0: can't start new thread"
            in caplog.text)
    assert session.digests_between(0, 3) == {}
    if fails == "loader":  # the pool made for it is shut down
        assert len(made) == 1 and made[0]._closed


def test_a_session_from_the_start_backfills_nothing(open_session) -> None:
    session = open_session()
    session.backfill(0, lambda: pytest.fail("not loaded"))
    assert session.backfilled.is_set()


def test_a_prepared_microbatch_counts_its_rows_and_bytes() -> None:
    from datalane_sidecar.session import Prepared
    cols = {"input_ids": np.zeros((3, 8), np.int32), "positions": np.zeros((3, 8), np.int32)}
    item = Prepared(0, 0, cols, False, None, {})
    assert (item.rows, item.nbytes, item.step_tokens) == (3, 2 * 3 * 8 * 4, 0)


def test_a_single_reader_holds_nothing_it_was_sent(open_session) -> None:
    """One reader never attaches again: what it was sent is dropped at once, acknowledged
    or not, and a checkpoint drops the boundaries before it."""
    session = open_session(prefetch=4)
    gen = session.claim(0)
    for _ in range(4):
        assert session.next(0, gen, 5.0) is not None
    assert session._fanout.base == 4
    _settle(lambda: 3 in session.digests, "step 3 computed")
    session.forget_before(2)
    assert min(session._boundaries) == 2


def test_kept_boundaries_and_digests_are_capped_oldest_first(open_session, monkeypatch) -> None:
    import datalane_sidecar.session as module
    monkeypatch.setattr(module, "_KEEP_BOUNDARIES", 3)
    monkeypatch.setattr(module, "_KEEP_DIGEST_STEPS", 2)
    session = open_session(prefetch=12)
    # 6 steps put, step 6 computed (its boundary after, 7, recorded) while the producer
    # waits for room: boundaries 0..7 and digests of steps 0..6, the newest 3 and 2 kept
    _settle(lambda: 6 in session.digests, "step 6 computed")
    assert list(session._boundaries) == [5, 6, 7] and list(session.digests) == [5, 6]
    assert session.kept_boundaries()["count"] == 3


def test_the_kept_boundaries_cost_their_lane_states(open_session, reference) -> None:
    session = open_session(prefetch=2)
    # step 0 put, step 1 computed while the producer waits for room: boundaries 0, 1, 2
    _settle(lambda: 1 in session.digests, "step 1 computed")
    want = sum(len(text) for step in (0, 1, 2) for text in _lanes(reference["states"][step])
               .values())
    assert session.kept_boundaries() == {"count": 3, "bytes": want}


def test_a_reader_acknowledges_from_a_skipped_start(open_session) -> None:
    session = open_session(skip_microbatches=1)
    gen = session.claim(0)
    session.acked_by(0, gen, (1, 0))  # step 0's second microbatch: the session's first
    assert session._fanout.slots[0].acked == 1


def test_a_closed_reader_is_no_longer_attached(open_session) -> None:
    session = open_session(readers=2)
    g0 = session.claim(0)
    session.detach(0, g0)
    assert [p["attached"] for p in session.reader_positions()] == [False, False]


def test_close_wakes_a_waiting_reader_and_the_wait_is_counted(open_session) -> None:
    session = open_session(readers=2, prefetch=1)
    g1 = session.claim(1)
    assert session.next(1, g1, 5.0) is not None  # reader 0 never reads: nothing more
    t0 = time.monotonic()
    assert session.next(1, g1, 0.3) is None
    assert 0.3 <= session.gauges()["waited_seconds"] < 5.0  # the time it waited, no more
    waited = session.waited_seconds
    assert session.describe()["waited_seconds"] == round(waited, 4)
    threading.Timer(0.3, session.close).start()
    assert session.next(1, g1, 5.0) is None
    assert time.monotonic() - t0 < 3.0  # woken by the close, not by its timeout


def test_a_ring_of_the_session_carries_its_layout(open_session, plan, reference,
                                                  tmp_path) -> None:
    session = open_session()
    assert session.layout == Layout.of(plan.schema, MB, plan.recipe.sequence_tokens)
    path = str(tmp_path / "ring.shm")
    ring = session.new_ring("h", path, 2, 0o600)
    try:
        gen = session.claim(0)
        item = session.next(0, gen, 5.0)
        assert item is not None
        slot = ring.acquire(timeout=1.0)
        assert slot is not None
        offset = ring.write(slot, item.columns)
        reader = ShmReader(path, ring.size, session.layout)
        assert reader.columns(offset)["input_ids"].tobytes() == reference["ids"][0][0]
        reader.close()
    finally:
        ring.close()


def test_two_readers_hold_an_unacknowledged_microbatch_prefetch_2_steps_and_64_back(
        open_session, reference) -> None:
    """With readers that may attach again, a microbatch sent but not acknowledged is kept
    until every reader's cursor is prefetch + 2 steps + 64 = 4 + 4 + 64 = 72 past it."""
    session = open_session(readers=2, prefetch=4)
    gens = [session.claim(0), session.claim(1)]
    assert session._thread.daemon  # a session never closed does not hold the process

    def take(n: int) -> None:
        for _ in range(n):
            for reader, gen in enumerate(gens):
                assert session.next(reader, gen, 5.0) is not None

    take(72)
    assert session._fanout.base == 0
    take(1)
    assert session._fanout.base == 1
    lanes = _lanes(reference["states"][0])
    assert session.attach(1, 0, lanes, 0) is None  # microbatch 0 is gone
    assert session.attach(1, 0, lanes, 1) is not None  # microbatch 1 is still held


def test_a_gather_sends_the_readers_next_microbatches_inline(open_session, plan,
                                                             reference) -> None:
    session = open_session()
    assert session.plan is plan
    gen = session.claim(0)
    sent = session.gather(0, gen, None, 5.0)
    assert [(m.step, m.index) for m in sent[:2]] == [(0, 0), (0, 1)]
    assert sent[0].columns is not None
    assert sent[0].columns[0] == reference["ids"][0][0]  # input_ids first, in schema order
    assert sent[1].state_json == reference["states"][1]


def test_a_checkpoint_waiting_for_a_boundary_is_woken_when_it_is_recorded(
        open_session, reference, monkeypatch) -> None:
    """Boundary 2 is recorded while the producer then waits for room (nobody reads, prefetch
    2): the recording itself must wake the request waiting for it."""
    release = _hold_step_1(monkeypatch)
    session = open_session(prefetch=2)
    try:
        _settle(lambda: session.queue_depth() == 2, "step 0 made")
        threading.Timer(0.3, release.set).start()
        t0 = time.monotonic()
        assert session.state_at(2, timeout=10) == reference["states"][2]
        assert time.monotonic() - t0 < 5.0
    finally:
        release.set()


@pytest.mark.parametrize("end", ["close", "producer error"])
def test_an_attach_waiting_for_a_boundary_ends_when_the_producer_does(
        open_session, reference, monkeypatch, end) -> None:
    """Boundary 2 is being computed (step 1 is held) when the session is closed or its
    producer fails: the attach waiting for it is refused at once, not at its wait's end."""
    release = _hold_step_1(monkeypatch, OSError("disk gone") if end == "producer error"
                           else None)
    session = open_session(prefetch=4)
    try:
        _settle(lambda: session.queue_depth() == 2, "step 0 made")
        if end == "close":
            threading.Timer(0.3, session.close).start()
        else:
            threading.Timer(0.3, release.set).start()
        t0 = time.monotonic()
        assert session.attach(0, 2, _lanes(reference["states"][2]), 0, wait=20.0) is None
        assert time.monotonic() - t0 < 5.0
    finally:
        release.set()


def test_forget_before_keeps_the_step_of_a_skipped_starts_held_microbatch(
        open_session) -> None:
    """Started at microbatch 1 of step 0: after 2 microbatches sent, (1, 1) is the next one
    held, so boundary 1 stays; after 3, (2, 0) is, and boundary 2 is the oldest kept."""
    session = open_session(skip_microbatches=1, prefetch=4)
    gen = session.claim(0)
    for _ in range(2):
        assert session.next(0, gen, 5.0) is not None
    session.forget_before(3)
    assert min(session._boundaries) == 1
    assert session.next(0, gen, 5.0) is not None
    session.forget_before(3)
    assert min(session._boundaries) == 2


def test_close_lets_go_of_the_lane_streams(open_session) -> None:
    session = open_session(prefetch=1)
    _settle(lambda: session.queue_depth() == 1, "1 made")
    assert session.loader._streams is not None
    session.close()
    assert session.loader._streams is None and not session._thread.is_alive()


def test_the_end_of_a_finite_stream_wakes_its_waiting_reader(open_session,
                                                            monkeypatch) -> None:
    """The producer is slow to see the end (held after its last put): the reader, already
    waiting for more, is woken when the stream is marked done, not at its timeout."""
    real = Session._put

    def slow_last(self: Session, item: Any) -> bool:
        put = real(self, item)
        if (item.step, item.index) == (0, 1):
            time.sleep(0.5)
        return put

    monkeypatch.setattr(Session, "_put", slow_last)
    session = open_session(stream="ev", steps=1)
    gen = session.claim(0)
    assert session.next(0, gen, 5.0) is not None and session.next(0, gen, 5.0) is not None
    t0 = time.monotonic()
    assert session.next(0, gen, 5.0) is None
    assert time.monotonic() - t0 < 3.0 and session.exhausted(0)


def test_a_resumed_session_counts_positions_from_its_first_step(open_session,
                                                               reference) -> None:
    """Opened at step 2: step 3's first microbatch is the session's third (number 2)."""
    session = open_session(start=_checkpoint(reference["states"][2]), readers=2)
    g0 = session.claim(0)
    for _ in range(4):
        assert session.next(0, g0, 5.0) is not None
    gen = session.attach(1, 3, _lanes(reference["states"][3]), 0)
    assert gen is not None
    item = session.next(1, gen, 5.0)
    assert item is not None and (item.step, item.index) == (3, 0)
    assert item.columns["input_ids"].tobytes() == reference["ids"][3][0]
    session.acked_by(1, gen, (3, 1))  # 3 microbatches of the session handed over
    assert session._fanout.slots[1].acked == 3


def test_the_queue_depth_is_counted_from_the_slowest_reader(open_session) -> None:
    session = open_session(prefetch=3)
    gen = session.claim(0)
    assert session.next(0, gen, 5.0) is not None
    # 1 sent, the producer 3 ahead of it again: 4 made, 3 ready
    _settle(lambda: session._fanout.produced == 4, "4 made")
    assert session.queue_depth() == 3 and session.describe()["queue_depth"] == 3


def test_one_new_microbatch_wakes_a_waiting_reader(open_session, monkeypatch) -> None:
    """Reader 1 never reads and prefetch is 3: once step 1 is released exactly one more
    microbatch is made, and reader 0, waiting for it, is woken by it."""
    release = _hold_step_1(monkeypatch)
    session = open_session(readers=2, prefetch=3)
    try:
        g0 = session.claim(0)
        session.claim(1)
        for _ in range(2):
            assert session.next(0, g0, 5.0) is not None
        threading.Timer(0.3, release.set).start()
        t0 = time.monotonic()
        item = session.next(0, g0, 5.0)
        assert item is not None and (item.step, item.index) == (1, 0)
        assert time.monotonic() - t0 < 3.0
    finally:
        release.set()


def test_a_backfill_replays_only_once_the_sessions_first_step_is_made(
        open_session, reference, monkeypatch) -> None:
    release = _hold_step_1(monkeypatch, step=3)
    session = open_session(start=_checkpoint(reference["states"][3]))
    loaded = threading.Event()

    def load() -> Checkpoint:
        loaded.set()
        return _checkpoint(reference["states"][1])

    try:
        session.backfill(1, load)
        assert not loaded.wait(0.5)  # the trainer's first step comes first
        release.set()
        assert session.backfilled.wait(20) and loaded.is_set()
        assert session.digests_between(1, 3) == {1: reference["digests"][1],
                                                 2: reference["digests"][2]}
    finally:
        release.set()

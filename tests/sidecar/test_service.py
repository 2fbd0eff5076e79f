"""The gRPC servicer (:class:`~datalane_sidecar.service.DataLaneService`) called in the test's
own process, without a server: each call gets a stand-in ``ServicerContext`` that raises on
abort with its status code and details and records the trailing metadata.

The tiny endless recipe of :func:`tests.sidecar.inproc.tiny_recipe` (4 lanes, a global batch of
8 sequences of 32 tokens) with one eval stream of 2 steps: at world size 1 with microbatches
of 4 a step is 2 microbatches. What the service hands out is compared with a plain
:class:`~datalane.engine.loader.Loader` run; its refusals by status code and message; the
ledger its checkpoints write by the steps whose digests a recording store was given.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from datalane_sidecar.delivery import RingClosed
from datalane_sidecar.metrics import Metrics
from datalane_sidecar.remote import RemoteSession
from datalane_sidecar.service import DataLaneService, _abort, _ring_slots
from datalane_sidecar.session import Session

from datalane import load_recipe
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.spec.errors import ConfigError, DataError, MismatchError, StorageError
from datalane.spec.evals import TRAIN, eval_recipe
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe
from datalane.spec.state import Checkpoint
from datalane.wire import (
    CLIENT_KEY,
    NO_SESSION_KEY,
    PROTOCOL_VERSION,
    STORE_ERROR_KEY,
    protocol_mismatch,
)
from datalane.wire import datalane_pb2 as pb
from datalane.wire.layout import announce_schema
from datalane.wire.shm import ShmWriter
from tests.sidecar.inproc import tiny_recipe

MB = 4  # microbatch size: 8 sequences a step at world size 1 are 2 microbatches
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    root = tmp_path_factory.mktemp("docs")
    (root / "train").mkdir()
    train = tiny_recipe(root / "train")
    for i in range(4):
        (root / f"held{i}.jsonl").write_text("".join(
            json.dumps({"text": f"held out {j} of {i} " + "xyz " * (j % 5 + 6)}) + "\n"
            for j in range(20)))
    return load_recipe({**train.to_dict(), "eval": [
        {"name": "held", "steps": 2,
         "sources": [{"name": "h", "uris": [str(root / "held*.jsonl")]}]}]})


@pytest.fixture(scope="module")
def plan(recipe: Recipe) -> Plan:
    return Plan.build(recipe)


def _run(recipe: Recipe, steps: int) -> dict[str, Any]:
    """``steps`` steps of the plain loader at world size 1: each step's microbatches
    (input_ids bytes), its lane digests, and the checkpoint JSON before each step."""
    loader = Loader(recipe, 0, 1)
    out: dict[str, Any] = {"ids": {}, "digests": {}, "states": {}}
    try:
        for s in range(steps):
            out["states"][s] = json.dumps(loader.state_dict(), separators=(",", ":"))
            step = loader.next_step()
            out["ids"][s] = [step.microbatch(i, MB).columns["input_ids"].tobytes()
                             for i in range(2)]
            out["digests"][s] = step.lane_digests
        out["states"][steps] = json.dumps(loader.state_dict(), separators=(",", ":"))
    finally:
        loader.close()
    return out


@pytest.fixture(scope="module")
def reference(recipe: Recipe) -> dict[str, Any]:
    return _run(recipe, 6)


@pytest.fixture(scope="module")
def eval_reference(recipe: Recipe) -> dict[str, Any]:
    return _run(eval_recipe(recipe, "held"), 2)


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class Context:
    """A ServicerContext as the service uses it: abort raises, the rest is recorded."""

    def __init__(self, client: str = "") -> None:
        self.metadata = ((CLIENT_KEY, client),) if client else ()
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.active = True
        self.callbacks: list[Callable[[], None]] = []

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = tuple(metadata)

    def is_active(self) -> bool:
        return self.active

    def add_callback(self, fn: Callable[[], None]) -> bool:
        self.callbacks.append(fn)
        return True


class Store:
    """A checkpoint store that records the pod objects written; ``commits`` says whether a
    commit makes a manifest, ``fail`` is raised by write_pod, ``committed`` is what
    committed_steps lists (or raises)."""

    uri = "mem://ckpt"

    def __init__(self, states: dict[int, str] | None = None) -> None:
        self.states = states or {}
        self.written: list[tuple[int, dict[int, dict[int, bytes]]]] = []
        self.loaded: list[tuple[Any, ...]] = []
        self.commits = True
        self.fail: BaseException | None = None
        self.committed: list[int] | BaseException = []

    def pod_uri(self, step: int, pod: str) -> str:
        return f"{self.uri}/step-{step}/pod-{pod}.json"

    def is_committed(self, step: int) -> bool:
        return False

    def committed_steps(self) -> list[int]:
        if isinstance(self.committed, BaseException):
            raise self.committed
        return list(self.committed)

    def load(self, step: int, *args: Any, **kwargs: Any) -> Checkpoint:
        self.loaded.append((step, *args, *sorted(kwargs)))
        return Checkpoint.from_json(json.loads(self.states[step]))

    def write_pod(self, step: int, pod: str, lanes: dict[int, Any],
                  digests: dict[int, dict[int, bytes]], fingerprint: str,
                  doc: dict[str, Any] | None, lanes_total: int) -> str:
        if self.fail is not None:
            raise self.fail
        self.written.append((step, {s: dict(row) for s, row in digests.items()}))
        return self.pod_uri(step, pod)

    def commit(self, step: int) -> object | None:
        return "manifest" if self.commits else None


@pytest.fixture
def make_service(plan: Plan, tmp_path: Path) -> Iterator[Callable[..., DataLaneService]]:
    """``make_service(store=None, **kw)``: a service of pod "pod" with one rank, its rings in
    ``tmp_path``; every session it holds is closed after the test."""
    made: list[DataLaneService] = []

    def make(store: Any | None = None, **kw: Any) -> DataLaneService:
        args: dict[str, Any] = dict(ranks_per_pod=1)
        args.update(kw)
        made.append(DataLaneService(plan, Knobs(workers=1), 4, store, "pod",
                                    shm_dir=str(tmp_path), metrics=Metrics(), **args))
        return made[-1]

    yield make
    for service in made:
        for session in list(service.sessions.values()):
            session.close()
        service.pool.shutdown(wait=False)


@pytest.fixture
def service(make_service: Callable[..., DataLaneService]) -> DataLaneService:
    return make_service()


def request(**kw: Any) -> pb.OpenRequest:
    args: dict[str, Any] = dict(protocol_version=PROTOCOL_VERSION, rank=0, world_size=1,
                                microbatch_size=MB)
    args.update(kw)
    return pb.OpenRequest(**args)


def aborted(call: Callable[[], Any]) -> Aborted:
    with pytest.raises(Aborted) as e:
        call()
    return e.value


def _settle(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class Acks:
    """A Stream's request iterator: the first Ack names the handle, the rest are put."""

    def __init__(self, hid: str) -> None:
        self.queue: queue.Queue[pb.Ack | None] = queue.Queue()
        self.queue.put(pb.Ack(session_id=hid))

    def __iter__(self) -> Iterator[pb.Ack]:
        return self

    def __next__(self) -> pb.Ack:
        ack = self.queue.get()
        if ack is None:
            raise StopIteration
        return ack

    def put(self, **kw: Any) -> None:
        self.queue.put(pb.Ack(**kw))

    def end(self) -> None:
        self.queue.put(None)


def _items(stream: Iterator[pb.Delivery], count: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < count:
        out.extend(next(stream).items)
    return out


def _read(service: DataLaneService, hid: str, count: int) -> list[Any]:
    """At least ``count`` microbatches of handle ``hid`` streamed (the producer goes on)."""
    return _items(service.Stream(Acks(hid), Context()), count)  # type: ignore[arg-type]


# -- helpers ----------------------------------------------------------------------------------

def test_a_ring_has_8_to_64_slots_as_many_as_4_mib_hold() -> None:
    assert _ring_slots(1 << 20) == 8  # 4 MiB hold 4: at least 8
    assert _ring_slots(100_000) == 41  # 4,194,304 // 100,000
    assert _ring_slots(65_537) == 63
    assert _ring_slots(65_536) == 64
    assert _ring_slots(1_000) == 64  # at most 64


@pytest.mark.parametrize(("error", "code"), [
    (MismatchError("m"), Code.FAILED_PRECONDITION),
    (ConfigError("m"), Code.INVALID_ARGUMENT),
    (StorageError("m", transient=True), Code.UNAVAILABLE),
    (StorageError("m"), Code.NOT_FOUND),
    (DataError("m"), Code.FAILED_PRECONDITION),
    (RuntimeError("m"), Code.INTERNAL),
], ids=lambda v: type(v).__name__ if isinstance(v, Exception) else "")
def test_an_error_becomes_its_status_code_with_the_message(error: BaseException,
                                                          code: grpc.StatusCode) -> None:
    e = aborted(lambda: _abort(Context(), error, "at open: "))  # type: ignore[arg-type]
    assert (e.code, e.details) == (code, "at open: m")


def test_the_admission_limit_counts_the_eval_streams(make_service) -> None:
    # 20 ranks x 8 readers x (training + 1 eval stream) = 320, above the floor of 256
    assert make_service(ranks_per_pod=20).admission.max_streams == 320
    assert make_service(max_streams=5).admission.max_streams == 5


# -- Open: refusals ---------------------------------------------------------------------------

def test_another_protocol_version_is_refused_first(service) -> None:
    e = aborted(lambda: service.Open(request(protocol_version=PROTOCOL_VERSION + 1,
                                             world_size=3), Context()))
    assert e.code == Code.FAILED_PRECONDITION
    assert e.details == protocol_mismatch(PROTOCOL_VERSION + 1, PROTOCOL_VERSION)


def test_a_draining_sidecar_refuses_an_open_as_unavailable(service) -> None:
    service.serving = False
    e = aborted(lambda: service.Open(request(), Context()))
    assert e.code == Code.UNAVAILABLE and "shutting down" in e.details
    assert not service.sessions


@pytest.mark.parametrize(("fields", "message"), [
    ({"stream": "nope"}, "no stream is named 'nope'"),
    ({"world_size": 5}, "4 lanes cannot be split over 5 ranks"),
    # before the resume is looked at (a store is neither needed nor asked)
    ({"world_size": 5, "from_step": 3}, "4 lanes cannot be split over 5 ranks"),
    ({"reader": 1}, "reader 1 is outside 0..0 for 1 readers of rank 0"),
    ({"readers": 2, "reader": 2}, "reader 2 is outside 0..1 for 2 readers of rank 0"),
    ({"from_step": 3}, "resume from_step needs a checkpoint store"),
    ({"stream": "held", "from_step": 3},
     "eval stream 'held' is never checkpointed, so it cannot resume from_step 3"),
], ids=["stream", "world", "world-first", "reader", "readers", "store", "eval"])
def test_a_bad_request_is_refused_naming_the_value(service, fields: dict[str, Any],
                                                   message: str) -> None:
    e = aborted(lambda: service.Open(request(**fields), Context()))
    assert e.code == Code.INVALID_ARGUMENT and message in e.details, e.details
    assert not service.sessions


def test_a_resume_state_that_is_no_json_is_a_mismatch(service) -> None:
    e = aborted(lambda: service.Open(request(state_json="{"), Context()))
    assert e.code == Code.FAILED_PRECONDITION and "state_json" in e.details


def test_a_resume_state_of_another_stream_is_refused_naming_the_stream(service,
                                                                       reference) -> None:
    e = aborted(lambda: service.Open(request(stream="held", state_json=reference["states"][1]),
                                     Context()))
    assert e.code == Code.FAILED_PRECONDITION
    assert e.details.startswith("the resume state of eval stream 'held' was saved with")


def test_a_trainer_expecting_another_fingerprint_is_refused(service, plan,
                                                            reference) -> None:
    other = "ab" * 32
    e = aborted(lambda: service.Open(request(fingerprint=other), Context()))
    assert (e.code, e.details) == (Code.FAILED_PRECONDITION, (
        f"the trainer expects recipe fingerprint {'ab' * 8}..., this sidecar serves "
        f"{plan.fingerprint[:16]}..."))
    # resuming, too: the state's own fingerprint is this recipe's
    e = aborted(lambda: service.Open(request(fingerprint=other,
                                             state_json=reference["states"][1]), Context()))
    assert e.details.startswith("the trainer expects recipe fingerprint")
    e = aborted(lambda: service.Open(request(stream="held", fingerprint=other), Context()))
    assert e.details.startswith("the trainer expects eval stream 'held' fingerprint")
    assert not service.sessions
    assert service.Open(request(fingerprint=plan.fingerprint), Context()).step == 0


# -- Open: sessions and readers -----------------------------------------------------------------

def test_the_reply_describes_the_session_and_its_layout(service, plan) -> None:
    reply = service.Open(request(rank=1, world_size=2, microbatch_size=2), Context())
    assert len(reply.session_id) == 16 and reply.protocol_version == PROTOCOL_VERSION
    assert (reply.step, reply.lane_start, reply.lane_stop, reply.seq_tokens,
            reply.microbatches_per_step, reply.readers, reply.stream, reply.steps) == (
        0, 2, 4, 33, 2, 1, "train", 0)
    assert reply.fingerprint == plan.fingerprint and not reply.shm_path
    session = service.sessions[reply.session_id]
    expected = pb.OpenReply()
    session.layout.announce(expected)
    assert (reply.schema_json, reply.slot_bytes) == (expected.schema_json, expected.slot_bytes)
    assert list(reply.layout) == list(expected.layout) and len(reply.layout) > 0
    assert reply.session_id in service.opened_at and reply.session_id not in service.clients
    held = service.Open(request(stream="held"), Context())
    assert (held.stream, held.steps, held.step) == ("held", 2, 0)
    assert held.fingerprint == service.plans["held"].fingerprint != plan.fingerprint


def test_a_shared_memory_open_gets_a_ring_of_its_own(service, tmp_path) -> None:
    reply = service.Open(request(transport=pb.TRANSPORT_SHM), Context())
    ring = service.rings[reply.session_id]
    assert reply.shm_path == str(tmp_path / f"datalane-{reply.session_id}.shm") == ring.path
    assert reply.shm_bytes == ring.size > 0
    slot_bytes = service.sessions[reply.session_id].layout.slot_bytes
    assert ring.slots == _ring_slots(slot_bytes)


def test_the_client_process_is_recorded_per_handle(service) -> None:
    reply = service.Open(request(), Context(client="proc-a"))
    assert service.clients == {reply.session_id: "proc-a"}


def test_a_second_reader_attaches_to_the_ranks_session(service) -> None:
    first = service.Open(request(readers=2), Context())
    second = service.Open(request(readers=2, reader=1), Context())
    assert list(service.sessions) == [first.session_id]
    session = service.sessions[first.session_id]
    assert service.handles[second.session_id].session is session
    assert service.handles[second.session_id].reader == 1
    assert (second.step, second.readers) == (0, 2)
    assert sorted(session.attached()) == [0, 1]
    # the same reader again: its old handle is replaced, the session stays
    again = service.Open(request(readers=2, reader=1, transport=pb.TRANSPORT_SHM), Context())
    assert list(service.sessions) == [first.session_id]
    assert second.session_id not in service.handles and again.session_id in service.handles
    assert first.session_id in service.handles
    assert again.session_id in service.rings


def test_a_reader_attaches_at_a_resume_state_the_session_holds(service, reference) -> None:
    first = service.Open(request(), Context())
    again = service.Open(request(state_json=reference["states"][1], skip_microbatches=1),
                         Context())
    assert list(service.sessions) == [first.session_id] and again.step == 1
    assert first.session_id not in service.handles
    stream = service.Stream(Acks(again.session_id), Context())  # type: ignore[arg-type]
    (item,) = _items(stream, 1)[:1]
    assert (item.step, item.index) == (1, 1)
    assert item.columns[0] == reference["ids"][1][1]


def test_another_layout_replaces_the_ranks_session(service) -> None:
    first = service.Open(request(readers=2), Context())
    old = service.sessions[first.session_id]
    for fields in ({"microbatch_size": 2}, {"world_size": 2}, {"readers": 1}):
        reply = service.Open(request(**fields), Context())
        assert list(service.sessions) == [reply.session_id] and reply.session_id in service.handles
        assert first.session_id not in service.handles
    assert old._stop.is_set()  # closed


def test_the_training_and_the_eval_session_of_a_rank_are_apart(service) -> None:
    train = service.Open(request(), Context())
    held = service.Open(request(stream="held"), Context())
    rank1 = service.Open(request(stream="held", rank=1, world_size=2, microbatch_size=2),
                         Context())
    assert set(service.sessions) == {train.session_id, held.session_id, rank1.session_id}
    again = service.Open(request(stream="held", microbatch_size=2), Context())
    assert set(service.sessions) == {train.session_id, again.session_id, rank1.session_id}
    assert [s.rank for s in service.metrics.sessions()] == [0]  # the training stream's


def test_a_reader_streamed_by_another_process_is_refused(service) -> None:
    first = service.Open(request(), Context(client="a"))
    service.streams[first.session_id] = Context()  # being streamed
    e = aborted(lambda: service.Open(request(), Context(client="b")))
    assert e.code == Code.INVALID_ARGUMENT
    assert e.details.startswith("reader 0 of rank 0 (readers=1) is already read by another "
                                "trainer process")
    e = aborted(lambda: service.Open(request(readers=2, reader=1), Context(client="b")))
    assert e.details.startswith("rank 0 is read by another trainer process with readers=1; "
                                "this one asks readers=2")
    assert list(service.handles) == [first.session_id]
    # its own process may, and so may one that names none
    again = service.Open(request(), Context(client="a"))
    assert list(service.handles) == [again.session_id]
    service.streams[again.session_id] = Context()
    unnamed = service.Open(request(), Context())
    assert list(service.handles) == [unnamed.session_id]


def test_a_reader_whose_stream_ended_may_be_taken_over(service) -> None:
    first = service.Open(request(), Context(client="a"))
    ended = Context()
    ended.active = False
    service.streams[first.session_id] = ended
    other_rank = service.Open(request(rank=1, world_size=2, microbatch_size=2),
                              Context(client="c"))
    service.streams[other_rank.session_id] = Context()
    taken = service.Open(request(), Context(client="b"))
    assert set(service.handles) == {taken.session_id, other_rank.session_id}
    assert service.clients[taken.session_id] == "b"
    # the next Open forgets the process of a handle that is gone
    again = service.Open(request(), Context(client="b"))
    assert service.clients == {taken.session_id: "b", other_rank.session_id: "c",
                               again.session_id: "b"}


def test_the_first_open_of_a_resume_reads_the_store(make_service, reference) -> None:
    store = Store(reference["states"])
    service = make_service(store)
    reply = service.Open(request(from_step=2), Context())
    assert reply.step == 2 and store.loaded[0] == (2,)


# -- Stream ------------------------------------------------------------------------------------

def test_a_stream_sends_the_loaders_microbatches_and_takes_acks(service, reference) -> None:
    reply = service.Open(request(), Context())
    hid = reply.session_id
    acks, context = Acks(hid), Context()
    stream = service.Stream(acks, context)  # type: ignore[arg-type]
    items = _items(stream, 4)
    assert [(m.step, m.index) for m in items[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for m in items[:4]:
        assert m.columns[0] == reference["ids"][m.step][m.index]
        assert m.sequences == MB and not m.ended and m.slot == 0
    assert [m.state_json for m in items[:4]] == ["", reference["states"][1], "",
                                                reference["states"][2]]
    assert dict(items[1].lane_digests) == reference["digests"][0] and not items[0].lane_digests
    session = service.sessions[hid]
    assert session.sent == (items[-1].step, items[-1].index)
    assert service.streams[hid] is context and hid not in service.opened_at
    acks.put(session_id=hid, has_position=True, step=1, consumed=1)
    _settle(lambda: session.acked == (1, 1), "the ack's position")
    context.callbacks[0]()  # the call ended
    assert hid not in service.streams
    acks.end()


def test_a_stream_through_a_ring_names_the_slots(service, reference) -> None:
    reply = service.Open(request(transport=pb.TRANSPORT_SHM), Context())
    hid = reply.session_id
    acks = Acks(hid)
    stream = service.Stream(acks, Context())  # type: ignore[arg-type]
    items = _items(stream, 2)
    assert [m.slot for m in items] == list(range(len(items)))
    assert all(not m.columns for m in items)
    ring = service.rings[hid]
    frees = len(ring._free)
    acks.put(session_id=hid, release=[0, 1])
    _settle(lambda: len(ring._free) == frees + 2, "the released slots")
    acks.end()


def test_a_stream_of_no_session_says_to_open_one(service) -> None:
    context = Context()
    e = aborted(lambda: next(service.Stream(iter([pb.Ack(session_id="nope")]), context)))  # type: ignore[arg-type]
    assert e.code == Code.NOT_FOUND and e.details.startswith("no session 'nope'; open one")
    assert context.trailing == ((NO_SESSION_KEY, "1"),)
    assert list(service.Stream(iter([]), Context())) == []  # type: ignore[arg-type]


def test_a_stream_ends_when_its_session_or_reader_is_replaced_or_the_sidecar_drains(
        service) -> None:
    reply = service.Open(request(readers=2), Context())
    reader1 = service.Open(request(readers=2, reader=1), Context())
    stream = service.Stream(Acks(reader1.session_id), Context())  # type: ignore[arg-type]
    next(stream)
    # reader 0 read nothing: the session still holds the start, reader 1 attaches there again
    again = service.Open(request(readers=2, reader=1), Context())
    e = aborted(lambda: next(stream))
    assert e.code == Code.ABORTED and e.details.startswith(
        f"reader 1 of session {reply.session_id} of rank 0 was opened again")
    stream = service.Stream(Acks(again.session_id), Context())  # type: ignore[arg-type]
    next(stream)
    other = service.Open(request(microbatch_size=2), Context())  # a new session
    e = aborted(lambda: next(stream))
    assert e.code == Code.ABORTED and e.details.startswith(
        f"session {reply.session_id} of rank 0 was closed")
    stream = service.Stream(Acks(other.session_id), Context())  # type: ignore[arg-type]
    next(stream)
    service.serving = False
    e = aborted(lambda: next(stream))
    assert e.code == Code.UNAVAILABLE and "shutting down" in e.details


def test_a_stream_whose_call_ended_stops(service) -> None:
    reply = service.Open(request(), Context())
    context = Context()
    stream = service.Stream(Acks(reply.session_id), context)  # type: ignore[arg-type]
    next(stream)
    context.active = False
    assert list(stream) == []


def test_an_eval_stream_ends_after_its_steps(service, eval_reference) -> None:
    reply = service.Open(request(stream="held"), Context())
    stream = service.Stream(Acks(reply.session_id), Context())  # type: ignore[arg-type]
    items = [m for d in stream for m in d.items]
    assert [(m.step, m.index) for m in items] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [m.columns[0] for m in items] == [b for s in (0, 1) for b in eval_reference["ids"][s]]


def test_the_first_delivery_of_a_handle_is_measured_once(service) -> None:
    reply = service.Open(request(), Context())
    stream = service.Stream(Acks(reply.session_id), Context())  # type: ignore[arg-type]
    _items(stream, 3)
    count = [s.value for m in service.metrics.first_microbatch.collect() for s in m.samples
             if s.name.endswith("_count")]
    assert count == [1.0] and service._first_sent


# -- Checkpoint ---------------------------------------------------------------------------------

def _checkpoint(service: DataLaneService, hid: str, step: int,
                context: Context | None = None) -> pb.CheckpointReply:
    return service.Checkpoint(pb.CheckpointRequest(session_id=hid, step=step),
                              context or Context())


def test_a_checkpoint_without_a_store_returns_the_state(service, reference) -> None:
    hid = service.Open(request(), Context()).session_id
    reply = _checkpoint(service, hid, 2)
    assert (reply.step, reply.object, reply.committed) == (2, "", False)
    assert reply.state_json == reference["states"][2]
    assert service.last_checkpoint == {hid: 2} and not service.uncommitted


def _with_store(make_service: Callable[..., DataLaneService],
                read: int) -> tuple[Store, DataLaneService, str]:
    """A service with a recording store, its rank 0 opened from the start and ``read``
    microbatches streamed (the producer goes on two steps ahead)."""
    store = Store()
    service = make_service(store)
    hid = service.Open(request(), Context()).session_id
    _read(service, hid, read)
    return store, service, hid


def test_a_checkpoint_lists_the_digests_since_the_last_committed_one(make_service,
                                                                     reference) -> None:
    store, service, hid = _with_store(make_service, 10)  # steps 0 to 4
    reply = _checkpoint(service, hid, 2)
    assert (reply.object, reply.committed) == ("mem://ckpt/step-2/pod-pod.json", True)
    store.commits = False  # step 4 is not committed: step 5 lists the digests since 2
    assert not _checkpoint(service, hid, 4).committed
    assert hid in service.uncommitted and service.last_checkpoint[hid] == 2
    store.committed = [3, 4, 5]  # ... unless another pod committed step 4 meanwhile
    _checkpoint(service, hid, 5)
    assert [(step, sorted(d)) for step, d in store.written] == [(2, [0, 1]), (4, [2, 3]),
                                                                 (5, [4])]
    assert store.written[2][1][4] == reference["digests"][4]
    assert service.last_checkpoint[hid] == 4


def test_an_uncommitted_checkpoint_keeps_the_ledger_when_nothing_committed(make_service,
                                                                           reference) -> None:
    store = Store()
    store.commits = False
    service = make_service(store)
    hid = service.Open(request(), Context()).session_id
    _read(service, hid, 6)
    _checkpoint(service, hid, 1)
    store.committed = StorageError("cannot list")  # a store that cannot tell: none committed
    _checkpoint(service, hid, 3)
    assert [(step, sorted(d)) for step, d in store.written] == [(1, [0]), (3, [0, 1, 2])]
    assert store.written[1][1][1] == reference["digests"][1]


@pytest.mark.parametrize(("error", "code", "kind"), [
    (StorageError("down", transient=True), Code.UNAVAILABLE, "transient"),
    (StorageError("refused"), Code.NOT_FOUND, "permanent"),
    (RuntimeError("boom"), Code.UNAVAILABLE, None),
], ids=["transient", "permanent", "other"])
def test_a_store_error_fails_the_checkpoint_marked_as_the_stores(
        make_service, error: BaseException, code: grpc.StatusCode, kind: str | None) -> None:
    store = Store()
    store.fail = error
    service = make_service(store)
    hid = service.Open(request(), Context()).session_id
    context = Context()
    e = aborted(lambda: _checkpoint(service, hid, 1, context))
    assert e.code == code and e.details.startswith("checkpoint of step 1 failed: ")
    assert e.details.endswith(str(error))
    assert context.trailing == (((STORE_ERROR_KEY, kind),) if kind else ())
    assert hid not in service.last_checkpoint


def test_an_eval_session_or_a_closing_sidecar_is_not_checkpointed(service) -> None:
    hid = service.Open(request(stream="held"), Context()).session_id
    e = aborted(lambda: _checkpoint(service, hid, 1))
    assert e.code == Code.INVALID_ARGUMENT and "eval stream 'held' is never checkpointed" \
        in e.details
    hid = service.Open(request(), Context()).session_id
    service.serving = False
    e = aborted(lambda: _checkpoint(service, hid, 1))
    assert e.code == Code.UNAVAILABLE and e.details.startswith(
        "the session of rank 0 closed while the checkpoint of step 1 waited")
    e = aborted(lambda: _checkpoint(service, "nope", 1))
    assert e.code == Code.NOT_FOUND


def test_a_resumed_session_rebuilds_the_ledger_from_the_last_committed_step(make_service,
                                                                            plan,
                                                                            reference) -> None:
    store = Store(reference["states"])
    store.committed = [1, 4]  # the newest committed at or before the resume step 3 is 1
    service = make_service(store)
    hid = service.Open(request(state_json=reference["states"][3]), Context()).session_id
    session = service.sessions[hid]
    assert session.backfilled.wait(10)
    assert service.last_checkpoint[hid] == 1
    assert store.loaded == [(1, session.lanes, "fingerprint", "fingerprint_doc")]
    _read(service, hid, 2)
    _checkpoint(service, hid, 4)
    assert [(step, sorted(d)) for step, d in store.written] == [(4, [1, 2, 3])]
    assert store.written[0][1][1] == reference["digests"][1]


def test_a_resume_at_a_committed_step_or_without_the_list_rebuilds_nothing(
        make_service, reference) -> None:
    store = Store(reference["states"])
    store.committed = [3]
    service = make_service(store)
    hid = service.Open(request(state_json=reference["states"][3]), Context()).session_id
    assert service.sessions[hid].backfilled.wait(10) and hid not in service.last_checkpoint
    store.committed = StorageError("cannot list")
    hid = service.Open(request(state_json=reference["states"][2]), Context()).session_id
    assert service.sessions[hid].backfilled.wait(10) and hid not in service.last_checkpoint
    assert store.loaded == []
    _read(service, hid, 2)
    _checkpoint(service, hid, 4)
    assert [(step, sorted(d)) for step, d in store.written] == [(4, [2, 3])]


# -- Close, Health, Stats, drain ------------------------------------------------------------------

def test_close_detaches_a_reader_and_the_last_closes_the_session(service, tmp_path) -> None:
    first = service.Open(request(readers=2, transport=pb.TRANSPORT_SHM), Context())
    second = service.Open(request(readers=2, reader=1), Context())
    session = service.sessions[first.session_id]
    reply = service.Close(pb.CloseRequest(session_id=first.session_id), Context())
    assert isinstance(reply, pb.CloseReply)  # (gRPC refuses a None reply)
    assert session.attached() == [1] and first.session_id in service.sessions
    assert not Path(first.shm_path).exists() and first.session_id not in service.rings
    assert first.session_id not in service.opened_at
    service.Close(pb.CloseRequest(session_id=second.session_id), Context())
    assert not service.sessions and not service.handles and session._stop.is_set()
    assert isinstance(service.Close(pb.CloseRequest(session_id="nope"), Context()),
                      pb.CloseReply)  # (an unknown session: nothing to close, still a reply)


def test_health_names_the_recipe_and_its_schema(service, plan) -> None:
    reply = service.Health(pb.HealthRequest(), Context())
    assert (reply.serving, reply.protocol_version, reply.fingerprint, reply.lanes) == (
        True, PROTOCOL_VERSION, plan.fingerprint, 4)
    expected = pb.HealthReply()
    announce_schema(expected, plan.schema)
    assert reply.schema_json == expected.schema_json != ""


def test_stats_describe_every_live_session(service, plan, monkeypatch) -> None:
    hid = service.Open(request(), Context()).session_id
    out = json.loads(service.Stats(pb.StatsRequest(), Context()).json)
    assert set(out) == {"fingerprint", "sessions"} and out["fingerprint"] == plan.fingerprint
    assert list(out["sessions"]) == [hid]
    assert (out["sessions"][hid]["rank"], out["sessions"][hid]["lanes"]) == (0, [0, 4])

    def gone() -> None:
        raise DataError("closed")

    monkeypatch.setattr(service.sessions[hid], "describe", gone)
    assert json.loads(service.Stats(pb.StatsRequest(), Context()).json)["sessions"] == {}


class _DescribedRanks:
    """Rank workers as Stats and drain see them: their description, and a stop."""

    def __init__(self) -> None:
        self.stopped = 0

    def describe(self) -> list[dict[str, int]]:
        return [{"worker": 0, "pid": 4242, "rss_bytes": 1 << 20}]

    def stop(self) -> None:
        self.stopped += 1


def test_stats_and_drain_of_a_sidecar_with_rank_workers(service) -> None:
    """Stats names each rank worker (and no map processes: they live in the workers); drain
    stops the workers once."""
    ranks = service.ranks = _DescribedRanks()
    out = json.loads(service.Stats(pb.StatsRequest(), Context()).json)
    assert out["rank_workers"] == [{"worker": 0, "pid": 4242, "rss_bytes": 1 << 20}]
    assert "map_processes" not in out
    assert service.drain() == {} and ranks.stopped == 1
    service.ranks = None


def test_drain_gives_each_ranks_acknowledged_position_and_closes(service, reference) -> None:
    hid = service.Open(request(), Context()).session_id
    service.Open(request(stream="held"), Context())
    acks = Acks(hid)
    stream = service.Stream(acks, Context())  # type: ignore[arg-type]
    _items(stream, 4)
    acks.put(session_id=hid, has_position=True, step=1, consumed=1)
    session = service.sessions[hid]
    _settle(lambda: session.acked == (1, 1), "the ack's position")
    sent = list(session.sent)
    out = service.drain()
    assert out == {0: {"state": json.loads(reference["states"][1]), "skip_microbatches": 1,
                       "world_size": 1, "delivered_through": sent}}
    assert not service.serving and not service.sessions and not service.handles
    acks.end()


def test_drain_of_a_session_nobody_acked_gives_its_start(service, reference) -> None:
    service.Open(request(state_json=reference["states"][2], skip_microbatches=1), Context())
    assert service.drain() == {0: {"state": json.loads(reference["states"][2]),
                                   "skip_microbatches": 1, "world_size": 1,
                                   "delivered_through": []}}


def test_stream_ended_leaves_a_newer_call_of_the_handle(service) -> None:
    hid = service.Open(request(), Context()).session_id
    old, new = Context(), Context()
    service.streams[hid] = new
    service._stream_ended(hid, old)  # type: ignore[arg-type]
    assert service.streams[hid] is new
    service._stream_ended(hid, new)  # type: ignore[arg-type]
    assert hid not in service.streams


def test_concurrent_opens_of_a_rank_build_one_session(service) -> None:
    replies: list[pb.OpenReply] = []
    threads = [threading.Thread(target=lambda r=r: replies.append(
        service.Open(request(readers=2, reader=r), Context()))) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(replies) == 2 and len(service.sessions) == 1
    assert {service.handles[r.session_id].reader for r in replies} == {0, 1}


# -- what the sweep of service.py left alive --------------------------------------------------

def _samples(metric: Any, suffix: str) -> float:
    return sum(s.value for m in metric.collect() for s in m.samples if s.name.endswith(suffix))


def test_opens_are_measured_and_only_a_training_resume_replays(service, reference,
                                                               eval_reference) -> None:
    metrics = service.metrics
    service.Open(request(), Context())
    service.Open(request(stream="held", state_json=eval_reference["states"][1]), Context())
    assert (_samples(metrics.open_seconds, "_count"), _samples(metrics.replay_seconds,
                                                               "_count")) == (2, 0)
    service.Open(request(state_json=reference["states"][2]), Context())
    assert (_samples(metrics.open_seconds, "_count"), _samples(metrics.replay_seconds,
                                                               "_count")) == (3, 1)
    # seconds the calls took, not clock readings
    assert 0 < _samples(metrics.open_seconds, "_sum") < 30
    assert 0 < _samples(metrics.replay_seconds, "_sum") < 30


def test_what_is_sent_is_counted_per_stream_and_the_first_is_logged_once(service, caplog) -> None:
    caplog.set_level(logging.INFO, logger="datalane.sidecar")
    first = service.Open(request(readers=2), Context())
    second = service.Open(request(readers=2, reader=1), Context())
    sent = len(next(service.Stream(Acks(first.session_id), Context())).items)  # type: ignore[arg-type]
    sent += len(next(service.Stream(Acks(second.session_id), Context())).items)  # type: ignore[arg-type]
    metrics = service.metrics
    assert _samples(metrics.microbatches, "_total") == sent
    assert _samples(metrics.eval_microbatches, "_total") == 0
    assert 0 <= _samples(metrics.first_microbatch, "_sum") < 30
    logged = [r for r in caplog.records if r.getMessage() == "first microbatch sent"]
    assert [r.session for r in logged] == [first.session_id] * 2  # type: ignore[attr-defined]
    # only the process's first microbatch says how long after the start it was sent
    assert [hasattr(r, "seconds_after_start") for r in logged] == [True, False]
    held = service.Open(request(stream="held"), Context())
    items = [m for d in service.Stream(Acks(held.session_id), Context()) for m in d.items]  # type: ignore[arg-type]
    assert _samples(metrics.eval_microbatches, "_total") == len(items) == 4
    assert _samples(metrics.microbatches, "_total") == sent


def test_a_reader_past_the_position_asked_for_gets_a_new_session(service) -> None:
    first = service.Open(request(), Context())
    _read(service, first.session_id, 2)  # a single reader holds nothing it was sent
    again = service.Open(request(), Context())
    assert list(service.sessions) == [again.session_id] and list(service.handles) == [
        again.session_id]


def test_a_replaced_reader_and_a_replaced_session_leave_no_ring(service) -> None:
    first = service.Open(request(readers=2), Context())
    second = service.Open(request(readers=2, reader=1, transport=pb.TRANSPORT_SHM), Context())
    again = service.Open(request(readers=2, reader=1), Context())
    assert not Path(second.shm_path).exists()
    assert second.session_id not in service.rings and second.session_id not in service.opened_at
    assert set(service.handles) == {first.session_id, again.session_id}
    third = service.Open(request(readers=2, reader=1, transport=pb.TRANSPORT_SHM), Context())
    other = service.Open(request(microbatch_size=2), Context())  # replaces the session
    assert not Path(third.shm_path).exists() and not service.rings
    assert list(service.opened_at) == [other.session_id]


def test_a_session_that_cannot_claim_its_reader_is_closed_with_its_ring(service, tmp_path,
                                                                        monkeypatch) -> None:
    closed: list[str] = []
    real_close = Session.close

    def refuse(self: Session, reader: int) -> int:
        raise DataError("cannot claim")

    def close(self: Session) -> None:
        closed.append(self.id)
        real_close(self)

    monkeypatch.setattr(Session, "claim", refuse)
    monkeypatch.setattr(Session, "close", close)
    e = aborted(lambda: service.Open(request(transport=pb.TRANSPORT_SHM), Context()))
    assert (e.code, e.details) == (Code.FAILED_PRECONDITION, "cannot claim")
    assert len(closed) == 1 and not list(tmp_path.glob("datalane-*.shm"))
    assert not service.sessions and not service.rings


def test_an_attach_that_fails_leaves_no_ring(service, tmp_path, monkeypatch) -> None:
    service.Open(request(readers=2), Context())

    def fails(self: Session, *args: Any, **kwargs: Any) -> int | None:
        raise DataError("its worker died")

    monkeypatch.setattr(Session, "attach", fails)
    e = aborted(lambda: service.Open(request(readers=2, reader=1,
                                             transport=pb.TRANSPORT_SHM), Context()))
    assert e.details == "its worker died" and not list(tmp_path.glob("datalane-*.shm"))


def test_closing_a_session_forgets_its_ledger_start(make_service) -> None:
    store = Store()
    store.commits = False
    service = make_service(store)
    hid = service.Open(request(), Context()).session_id
    _checkpoint(service, hid, 1)
    assert hid in service.uncommitted and service.last_checkpoint == {}
    service.Close(pb.CloseRequest(session_id=hid), Context())
    assert not service.uncommitted
    hid = service.Open(request(), Context()).session_id
    store.commits = True
    _checkpoint(service, hid, 1)
    assert service.last_checkpoint == {hid: 1}
    service.Close(pb.CloseRequest(session_id=hid), Context())
    assert service.last_checkpoint == {}


def test_a_committed_checkpoint_ignores_what_other_pods_committed(make_service,
                                                                  caplog) -> None:
    store, service, hid = _with_store(make_service, 12)  # steps 0 to 5
    _checkpoint(service, hid, 2)
    store.committed = [3]  # this pod's last object committed: its ledger starts at 2
    _checkpoint(service, hid, 4)
    session = service.sessions[hid]
    assert min(session.digests) == 4  # forgotten before the last committed step
    store.commits = False
    store.committed = [5]
    _checkpoint(service, hid, 6)  # uncommitted: the ledger still starts at 4 ...
    assert hid in service.uncommitted
    store.commits = True
    _checkpoint(service, hid, 7)  # ... until a later pod committed 5
    assert all(s >= 7 for s in session.digests) and not service.uncommitted
    assert [(step, sorted(d)) for step, d in store.written] == [
        (2, [0, 1]), (4, [2, 3]), (6, [4, 5]), (7, [5, 6])]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_checkpoint_of_a_step_not_reached_is_refused_naming_it(service,
                                                                 monkeypatch) -> None:
    hid = service.Open(request(), Context()).session_id

    def never(step: int, timeout: float = 60.0) -> str:
        raise ConfigError(f"step {step} was not reached within 60 s")

    monkeypatch.setattr(service.sessions[hid], "state_at", never)
    e = aborted(lambda: _checkpoint(service, hid, 9))
    assert (e.code, e.details) == (Code.INVALID_ARGUMENT, "step 9 was not reached within 60 s")


def test_a_producer_error_ends_the_stream_after_what_was_made(service, reference,
                                                              monkeypatch) -> None:
    real = Loader.next_step

    def fails_at_2(self: Loader) -> Any:
        if self.step == 2:
            raise DataError("record 7 of f1.jsonl is not JSON")
        return real(self)

    monkeypatch.setattr(Loader, "next_step", fails_at_2)
    hid = service.Open(request(), Context()).session_id
    stream = service.Stream(Acks(hid), Context())  # type: ignore[arg-type]
    got: list[Any] = []
    with pytest.raises(Aborted) as e:
        while True:
            got.extend(next(stream).items)
    assert [(m.step, m.index) for m in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert (e.value.code, e.value.details) == (Code.FAILED_PRECONDITION,
                                               "record 7 of f1.jsonl is not JSON")


def test_an_error_of_a_reader_replaced_meanwhile_ends_its_stream_as_replaced(service,
                                                                             monkeypatch) -> None:
    hid = service.Open(request(), Context()).session_id
    session = service.sessions[hid]

    def replaced(*args: Any, **kwargs: Any) -> list[Any]:
        del service.handles[hid]  # (its reader was opened again while it waited)
        raise DataError("the reader was attached again")

    monkeypatch.setattr(session, "gather", replaced)
    e = aborted(lambda: next(service.Stream(Acks(hid), Context())))  # type: ignore[arg-type]
    assert e.code == Code.ABORTED and e.details.startswith(f"reader 0 of session {hid}")


def test_rank_workers_that_die_close_only_their_sessions(service, plan) -> None:
    class Worker:
        lost = None

        def call(self, *args: Any) -> Any:
            return None

        def tell(self, *args: Any) -> None:
            return None

    a, b = Worker(), Worker()
    local = service.Open(request(rank=1, world_size=2, microbatch_size=2), Context())
    for worker, sid in ((a, "a" * 16), (b, "b" * 16)):
        service.sessions[sid] = RemoteSession(
            worker, sid, plan, service.stream_texts[TRAIN], TRAIN, 0, 2, 2, 1, 0,  # type: ignore[arg-type]
            None, None, {"first_step": 0, "per_step": 2, "lanes": (0, 2)})
    service._worker_lost(a)  # type: ignore[arg-type]
    assert set(service.sessions) == {"b" * 16, local.session_id}


def test_drain_ends_a_checkpoint_waiting_for_the_pods_other_rank(make_service) -> None:
    service = make_service(Store(), ranks_per_pod=2)
    hid = service.Open(request(), Context()).session_id
    out: dict[str, Aborted] = {}

    def checkpoint() -> None:
        try:
            _checkpoint(service, hid, 1)
        except Aborted as e:
            out["aborted"] = e

    t = threading.Thread(target=checkpoint, daemon=True)
    t.start()
    _settle(lambda: 1 in service.checkpoints._pending, "the checkpoint waiting")
    service.drain()
    t.join(10)
    assert out["aborted"].code == Code.UNAVAILABLE
    assert out["aborted"].details == ("checkpoint of step 1 failed: step 1: the sidecar is "
                                      "shutting down; ask again")
    assert service.pool._closed


def test_the_metrics_export_the_call_limit_and_the_calls_in_flight(service) -> None:
    registry = service.metrics.registry
    assert registry.get_sample_value("datalane_max_streams") == 256
    assert registry.get_sample_value("datalane_calls_in_flight", {"kind": "open"}) == 0
    service.admission.active["open"] = 3  # (as three Opens in flight count themselves)
    assert registry.get_sample_value("datalane_calls_in_flight", {"kind": "open"}) == 3


def test_a_ring_is_mapped_by_the_sockets_users_only(service) -> None:
    reply = service.Open(request(transport=pb.TRANSPORT_SHM), Context())
    assert os.stat(reply.shm_path).st_mode & 0o777 == 0o600


def test_a_resume_state_without_every_lane_of_the_rank_leaves_its_session(service,
                                                                          recipe) -> None:
    loader = Loader(recipe, 0, 2)  # lanes 0 and 1 of 4
    try:
        half = json.dumps(loader.state_dict(), separators=(",", ":"))
    finally:
        loader.close()
    first = service.Open(request(), Context())
    e = aborted(lambda: service.Open(request(state_json=half), Context()))
    assert e.code == Code.FAILED_PRECONDITION and "lane" in e.details, e.details
    assert list(service.sessions) == [first.session_id]


def test_a_ring_that_cannot_be_made_closes_the_new_session(service, tmp_path,
                                                           monkeypatch) -> None:
    closed: list[str] = []
    real_close = Session.close

    def close(self: Session) -> None:
        closed.append(self.id)
        real_close(self)

    monkeypatch.setattr(Session, "close", close)
    service.shm_dir = str(tmp_path / "gone")
    with pytest.raises(FileNotFoundError):
        service.Open(request(transport=pb.TRANSPORT_SHM), Context())
    assert len(closed) == 1 and not service.sessions


class _Worker:
    """A rank worker as a RemoteSession calls it: every call answers 1; the worker is lost
    once it answered a call named ``dies_at``."""

    def __init__(self, dies_at: str = "") -> None:
        self.lost: str | None = None
        self.dies_at = dies_at

    def call(self, *args: Any) -> Any:
        if args[2:3] == (self.dies_at,):
            self.lost = "the rank worker process 0 (pid 4242) was killed by signal 9"
        return 1

    def tell(self, *args: Any) -> None:
        return None


class _Ranks:
    """Rank worker processes that open each session in a new :class:`_Worker`."""

    def __init__(self, dies_at: str = "") -> None:
        self.workers: list[_Worker] = []
        self.dies_at = dies_at

    def open(self, hid: str, plan: Plan, texts: Any, stream: str, rank: int, world_size: int,
             microbatch_size: int, start: Checkpoint | None, skip: int, readers: int,
             steps: int | None) -> RemoteSession:
        self.workers.append(_Worker(self.dies_at))
        return RemoteSession(self.workers[-1], hid, plan, texts, stream, rank,  # type: ignore[arg-type]
                             world_size, microbatch_size, readers, skip, steps, start,
                             {"first_step": 0, "per_step": 2, "lanes": (0, 4)})


def test_a_session_whose_worker_died_as_it_opened_is_closed_and_unavailable(service) -> None:
    service.ranks = _Ranks(dies_at="claim")
    e = aborted(lambda: service.Open(request(), Context()))
    assert (e.code, e.details) == (Code.UNAVAILABLE, service.ranks.workers[0].lost)
    assert not service.sessions and not service.handles


def test_a_session_whose_worker_died_is_replaced_not_attached_to(service) -> None:
    ranks = service.ranks = _Ranks()
    first = service.Open(request(), Context())
    ranks.workers[0].lost = "the rank worker process 0 (pid 4242) was killed by signal 9"
    again = service.Open(request(), Context())
    assert list(service.sessions) == [again.session_id] != [first.session_id]
    assert service.sessions[again.session_id].worker is ranks.workers[1]


def test_an_attach_to_a_session_closed_meanwhile_opens_a_new_one(service, monkeypatch) -> None:
    first = service.Open(request(readers=2), Context())
    old = service.sessions[first.session_id]
    real_attach, real_close = Session.attach, ShmWriter.close
    closed: list[ShmWriter] = []

    def closing(self: Session, *args: Any, **kwargs: Any) -> int | None:
        generation = real_attach(self, *args, **kwargs)
        service._close(self.id)  # (the rank was opened again elsewhere as it attached)
        return generation

    def close(self: ShmWriter) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(Session, "attach", closing)
    monkeypatch.setattr(ShmWriter, "close", close)
    again = service.Open(request(readers=2, reader=1, transport=pb.TRANSPORT_SHM), Context())
    assert list(service.sessions) == [again.session_id] != [first.session_id]
    assert old.attached() == [0]  # the attachment made as it closed was undone
    assert len(closed) == 1 and closed[0] is not service.rings[again.session_id]


def test_opens_and_attaches_are_logged_with_their_session_and_reader(service, caplog) -> None:
    caplog.set_level(logging.INFO, logger="datalane.sidecar")
    first = service.Open(request(readers=2), Context())
    service.Open(request(readers=2, reader=1), Context())
    assert [(r.getMessage(), r.session, r.reader) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "datalane.sidecar"] == [("session opened", first.session_id, 0),
                                                 ("reader attached", first.session_id, 1)]


def test_a_store_that_cannot_list_its_commits_is_logged_and_the_session_starts(
        make_service, reference, caplog) -> None:
    store = Store(reference["states"])
    store.committed = StorageError("cannot list")
    service = make_service(store)
    hid = service.Open(request(state_json=reference["states"][2]), Context()).session_id
    assert service.sessions[hid].backfilled.wait(10)
    (warned,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned.startswith("cannot list committed checkpoints to start the ledger: ")
    assert warned.endswith("cannot list")


def test_a_release_on_an_inline_stream_is_ignored(service) -> None:
    hid = service.Open(request(), Context()).session_id
    acks = Acks(hid)
    _items(service.Stream(acks, Context()), 2)  # type: ignore[arg-type]
    acks.put(session_id=hid, release=[0])  # (no ring to release it to)
    acks.put(session_id=hid, has_position=True, step=0, consumed=1)
    _settle(lambda: service.sessions[hid].acked == (0, 1), "the ack after the release")
    acks.end()


def test_the_stream_of_a_session_whose_worker_died_is_unavailable(service) -> None:
    ranks = service.ranks = _Ranks()
    hid = service.Open(request(), Context()).session_id
    ranks.workers[0].lost = "the rank worker process 0 (pid 4242) was killed by signal 9"
    e = aborted(lambda: next(service.Stream(Acks(hid), Context())))  # type: ignore[arg-type]
    assert (e.code, e.details) == (Code.UNAVAILABLE, ranks.workers[0].lost)


@pytest.mark.parametrize(("draining", "code"), [(False, Code.ABORTED),
                                                (True, Code.UNAVAILABLE)])
def test_a_ring_closed_under_a_stream_ends_it(service, monkeypatch, draining: bool,
                                              code: grpc.StatusCode) -> None:
    hid = service.Open(request(transport=pb.TRANSPORT_SHM), Context()).session_id

    def closed(*args: Any, **kwargs: Any) -> list[Any]:
        service.serving = not draining  # (a drain that began while it waited)
        raise RingClosed(f"session {hid} was closed while it waited for a free slot")

    monkeypatch.setattr(service.sessions[hid], "gather", closed)
    e = aborted(lambda: next(service.Stream(Acks(hid), Context())))  # type: ignore[arg-type]
    assert (e.code, e.details) == (code, f"session {hid} was closed while it waited for a "
                                         f"free slot")


def test_a_worker_lost_while_gathering_ends_the_stream_unavailable(service,
                                                                  monkeypatch) -> None:
    ranks = service.ranks = _Ranks()
    hid = service.Open(request(), Context()).session_id
    lost = "the rank worker process 0 (pid 4242) was killed by signal 9"

    def dies(*args: Any, **kwargs: Any) -> list[Any]:
        ranks.workers[0].lost = lost
        raise DataError("the pipe to the rank worker broke")

    monkeypatch.setattr(service.sessions[hid], "gather", dies)
    e = aborted(lambda: next(service.Stream(Acks(hid), Context())))  # type: ignore[arg-type]
    assert (e.code, e.details) == (Code.UNAVAILABLE, lost)

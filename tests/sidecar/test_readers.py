"""Several readers of one data-parallel rank (TP/CP peers), refused Opens, kept boundaries.

Real sidecar processes on real Unix sockets (the ``sidecar`` fixture). The readers speak raw
gRPC through the stubs (:class:`_Reader`), so these tests pin the sidecar's side of the
protocol whatever the client does; the healthy trainer of the refused-Open test is the shipped
``SidecarLoader``. Every stream is compared with the in-process mode.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import grpc
import pytest
from datalane_sidecar.session import Session

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.corpus import tokenizer_path
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.knobs import Knobs
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from datalane.wire.layout import Layout
from datalane.wire.shm import ShmReader

pytestmark = pytest.mark.slow  # real sidecar processes

Item = tuple[int, int, bytes, bytes]  # (step, index, input_ids, positions) as <i4 bytes


class _Reader:
    """One trainer rank reading data-parallel rank ``rank`` as reader ``reader`` of
    ``readers``: Open, Stream (releasing shared-memory slots), its position, raw gRPC."""

    def __init__(self, socket: str, *, rank: int = 0, world_size: int = 1, mb: int = 4,
                 readers: int = 2, reader: int = 0, shm: bool = False) -> None:
        self.channel = grpc.insecure_channel(f"unix://{os.path.abspath(socket)}")
        self.stub = pbg.DataLaneStub(self.channel)
        self.rank, self.world_size, self.mb = rank, world_size, mb
        self.readers, self.reader, self.shm = readers, reader, shm
        self.step, self.consumed, self.state = 0, 0, ""  # the position; "" = the start
        self.states: dict[int, str] = {}  # step -> the state_json sent after it

    def request(self, **overrides: Any) -> pb.OpenRequest:
        req = pb.OpenRequest(protocol_version=PROTOCOL_VERSION, rank=self.rank,
                             world_size=self.world_size, microbatch_size=self.mb,
                             skip_microbatches=self.consumed, readers=self.readers,
                             reader=self.reader, transport=pb.TRANSPORT_SHM if self.shm
                             else pb.TRANSPORT_INLINE)
        if self.state:
            req.state_json = self.state
        else:
            req.from_start = True
        for k, v in overrides.items():
            setattr(req, k, v)
        return req

    def open(self) -> pb.OpenReply:
        self.reply: pb.OpenReply = self.stub.Open(self.request(), timeout=60)
        self.acks: queue.Queue[pb.Ack | None] = queue.Queue()
        self.acks.put(pb.Ack(session_id=self.reply.session_id))
        self.calls = self.stub.Stream(iter(self.acks.get, None))
        self.items: Iterator[pb.Microbatch] = chain.from_iterable(d.items for d in self.calls)
        self.layout = Layout.announced(self.reply, "the reply to Open")
        self.ring = (ShmReader(self.reply.shm_path, self.reply.shm_bytes, self.layout)
                     if self.reply.shm_path else None)
        return self.reply

    def take(self, n: int) -> list[Item]:
        out = []
        per_step = self.reply.microbatches_per_step
        for _ in range(n):
            msg = next(self.items)
            if self.ring is not None:
                columns = self.ring.columns(msg.offset)
                ids, pos = (columns[k].tobytes() for k in ("input_ids", "positions"))
            else:
                ids, pos = msg.columns  # the text recipe's two columns, in schema order
            out.append((int(msg.step), msg.index, ids, pos))
            if msg.index + 1 == per_step:
                self.step, self.consumed, self.state = int(msg.step) + 1, 0, msg.state_json
                self.states[int(msg.step)] = msg.state_json
            else:
                self.step, self.consumed = int(msg.step), msg.index + 1
            # the slot back and the position, as the shipped client does (it batches them)
            self.acks.put(pb.Ack(release=[msg.slot] if self.ring is not None else [],
                                 has_position=True, step=self.step, consumed=self.consumed))
        return out

    def drop(self) -> None:
        """The trainer died: its stream goes away without a Close."""
        self.acks.put(None)
        self.calls.cancel()

    def close(self) -> None:
        self.drop()
        self.stub.Close(pb.CloseRequest(session_id=self.reply.session_id), timeout=10)
        self.channel.close()


def _reference(recipe: Any, rank: int, world: int, mb: int, n: int) -> list[Item]:
    ref = InProcessLoader(recipe, rank, world, mb)
    out = []
    try:
        for b in ref:
            out.append((b.step, b.index, b.input_ids.astype("<i4").tobytes(),
                        b.positions.astype("<i4").tobytes()))
            if len(out) == n:
                return out
    finally:
        ref.close()
    raise AssertionError("unreachable: the stream is endless")


def _states(recipe: Any, rank: int, world: int, steps: int) -> dict[int, str]:
    """The checkpoint JSON after each step, as the in-process engine dumps it."""
    loader = Loader(recipe, rank, world)
    try:
        out = {}
        for s in range(steps):
            loader.next_step()
            out[s] = json.dumps(loader.state_dict(), separators=(",", ":"))
        return out
    finally:
        loader.close()


def _sessions(reader: _Reader) -> dict[str, Any]:
    stats = json.loads(reader.stub.Stats(pb.StatsRequest(), timeout=10).json)
    return stats["sessions"]  # type: ignore[no-any-return]


def _wait_for(check: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _aborted(reader: _Reader, limit: int = 200) -> grpc.RpcError:
    """Read what was in flight until the stream's error."""
    with pytest.raises(grpc.RpcError) as info:
        reader.take(limit)
    assert info.value.code() == grpc.StatusCode.ABORTED, info.value
    return info.value


# -- one session, several readers -------------------------------------------------------------

def test_two_readers_share_one_producer_and_get_the_same_bytes(sidecar, repeat_recipe) -> None:
    """Reader 0 (shm) opens, reads 6 microbatches; the producer waits for reader 1, which has
    not attached (prefetch 8 = 2 steps of 4 ahead of the start). Reader 1 (inline) attaches,
    both read 16: the in-process bytes, the same step states byte for byte, one session with
    readers=2, each step produced once. Before: reader 1's Open replaced the session and
    reader 0 got ABORTED."""
    sc = sidecar(repeat_recipe, "--prefetch", "8")
    recipe = load_recipe(repeat_recipe)
    r0 = _Reader(sc.socket, reader=0, shm=True)
    r1 = _Reader(sc.socket, reader=1)
    first = r0.open()
    assert first.readers == 2 and first.microbatches_per_step == 4
    got0 = r0.take(6)
    # 8 microbatches ahead of reader 1 (at 0): steps 0-1 handed over, step 2 made and waiting
    _wait_for(lambda: _sessions(r0)[first.session_id]["next_step"] == 3, "producer at 3")
    time.sleep(1.0)
    (sid, info), = _sessions(r0).items()
    assert (sid, info["next_step"], info["readers"], info["attached"]) == (
        first.session_id, 3, 2, [0])
    second = r1.open()
    assert second.session_id != first.session_id and second.readers == 2
    assert second.step == 0
    got1 = r1.take(16)
    got0 += r0.take(10)
    ref = _reference(recipe, 0, 1, 4, 16)
    assert got0 == ref
    assert got1 == ref
    assert r0.states == r1.states == _states(recipe, 0, 1, 4)  # sent byte for byte as before
    (sid, info), = _sessions(r0).items()
    assert sid == first.session_id and info["readers"] == 2 and info["attached"] == [0, 1]
    # made once, at most 8 microbatches (2 steps) ahead of the reader sent the fewest (the
    # streams send ahead of what the test took), plus the step waiting to be handed over
    slowest = min(p["sent"][0] * 4 + p["sent"][1] + 1 for p in info["reader_positions"])
    assert slowest >= 16 and info["first_step"] == 0
    assert info["next_step"] <= (slowest + 8) // 4 + 1
    r0.close()
    r1.close()


def test_a_restarted_reader_reattaches_and_a_lost_position_replaces(sidecar,
                                                                   repeat_recipe) -> None:
    """Reader 1 (shm) re-opens at its position, which is held (its client acknowledged it;
    what was sent beyond it is still kept): only its stream is replaced, reader 0 streams on,
    nothing is made twice. Re-opened at a position both readers are past, the session is
    replaced as in an elastic restart."""
    sc = sidecar(repeat_recipe, "--prefetch", "8")
    recipe = load_recipe(repeat_recipe)
    ref = _reference(recipe, 0, 1, 4, 24)
    r0 = _Reader(sc.socket, reader=0)
    r1 = _Reader(sc.socket, reader=1, shm=True)
    sid = r0.open().session_id
    r1.open()
    got0, got1 = r0.take(9), r1.take(5)  # reader 1 at step 1, one microbatch in
    _wait_for(lambda: _sessions(r0)[sid]["reader_positions"][1]["acked"] == [1, 1], "ack")
    # reader 1's old stream is still connected: it ends with ABORTED
    again = _Reader(sc.socket, reader=1, shm=True)
    again.step, again.consumed, again.state = r1.step, r1.consumed, r1.state
    reply = again.open()
    assert reply.session_id not in (sid, r1.reply.session_id) and reply.step == 1
    assert f"session {sid}" in _aborted(r1).details()
    got1 = got1[:5] + again.take(11)
    got0 += r0.take(7)
    assert got0 == ref[:16] and got1 == ref[:16]
    assert list(_sessions(r0)) == [sid]
    # reader 1 restarts from step 1 again, which both readers are past (dropped): the
    # session is replaced as in an elastic restart, and reader 0's stream ends with ABORTED
    late = _Reader(sc.socket, reader=1)
    late.step, late.consumed, late.state = 1, 0, r1.states[0]
    new = late.open()
    assert f"session {sid} of rank 0 was closed" in _aborted(r0).details()
    assert list(_sessions(late)) == [new.session_id] and new.step == 1
    assert late.take(8) == ref[4:12]
    late.close()


def test_an_open_that_cannot_attach_replaces_the_session(sidecar, repeat_recipe) -> None:
    """Another world size (an elastic restart) replaces the rank's session even with
    readers=2; the new one serves two readers of its own."""
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    r0 = _Reader(sc.socket, reader=0)
    old = r0.open().session_id
    r0.take(3)
    w2 = [_Reader(sc.socket, world_size=2, mb=2, reader=k) for k in (0, 1)]
    new = w2[1].open()
    assert new.readers == 2 and (new.lane_start, new.lane_stop) == (0, 4)
    _aborted(r0)
    w2[0].open()
    assert w2[0].take(6) == w2[1].take(6) == _reference(recipe, 0, 2, 2, 6)
    (sid, info), = _sessions(w2[0]).items()
    assert sid == new.session_id != old and info["readers"] == 2
    assert info["world_size"] == 2 and info["attached"] == [0, 1]


def test_a_reader_index_past_readers_is_refused(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe)
    r0 = _Reader(sc.socket, reader=0)
    r0.open()
    r0.take(2)
    with pytest.raises(grpc.RpcError) as info:
        r0.stub.Open(r0.request(reader=2, from_start=True), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == ("reader 2 is outside 0..1 for 2 readers of rank 0; the "
                                    "reader index must be below readers")
    # untouched: reader 0 streams on, as far as the producer may run ahead of reader 1 (which
    # has not attached: at the start) - the 8 microbatches of --prefetch
    assert r0.take(6) == _reference(load_recipe(repeat_recipe), 0, 1, 4, 8)[2:]
    r0.close()


def test_readers_of_one_rank_count_once_in_the_pod_object(sidecar, repeat_recipe,
                                                         tmp_path) -> None:
    """Two data-parallel ranks per pod, two readers each: both readers of rank 0 asking must
    not complete the pod (they would have counted 2 of --ranks-per-pod 2, and the object
    would have lacked rank 1's lanes); once rank 1's readers ask, one object, committed."""
    from datalane.store import CheckpointStore

    store_uri = str(tmp_path / "store")
    sc = sidecar(repeat_recipe, "--store", store_uri, "--ranks-per-pod", "2", "--pod", "p0")
    readers = [_Reader(sc.socket, rank=r, world_size=2, mb=4, reader=k)
               for r in (0, 1) for k in (0, 1)]
    for rd in readers:
        rd.open()
        rd.take(4)  # steps 0 and 1 (2 microbatches per step)
    replies: dict[int, Any] = {}

    def ask(i: int) -> None:
        rd = readers[i]
        try:
            replies[i] = rd.stub.Checkpoint(pb.CheckpointRequest(
                session_id=rd.reply.session_id, step=2), timeout=120)
        except grpc.RpcError as e:  # handed to the test
            replies[i] = e

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads[:2]:
        t.start()
    time.sleep(2.0)
    store = CheckpointStore(store_uri)
    assert not (tmp_path / "store" / "steps").exists() or not list(
        (tmp_path / "store" / "steps").rglob("*.json"))
    assert store.latest_committed() is None
    for t in threads[2:]:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(replies) == [0, 1, 2, 3]
    assert {(r.step, r.committed, os.path.basename(r.object)) for r in replies.values()} == {
        (2, True, "pod-p0.json")}
    assert sorted(store.load(2).lanes) == list(range(8))
    for rd in readers:
        rd.close()


# -- a refused request leaves the rank's session alone ----------------------------------------

def test_a_refused_open_does_not_tear_down_the_ranks_session(sidecar, repeat_recipe) -> None:
    """Bad Opens for rank 1 (a microbatch size that does not divide the
    local batch, too many microbatches to skip, a state without the rank's lanes) are refused,
    and the healthy trainer of rank 1 streams on without a re-open, the in-process bytes.
    Before, each bad Open closed its session first."""
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    good = SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=2)
    it = iter(good)
    got = [next(it) for _ in range(3)]
    rd = _Reader(sc.socket, rank=1, world_size=2, mb=2, readers=1)
    other = InProcessLoader(recipe, 0, 2, 2)  # rank 0's lanes only
    for _ in zip(range(4), other, strict=False):
        pass
    foreign = json.dumps(other.state_dict()["state"])
    bad = [(dict(microbatch_size=3), grpc.StatusCode.INVALID_ARGUMENT,
            "microbatch size 3 does not divide the local batch of 8 sequences"),
           (dict(skip_microbatches=4), grpc.StatusCode.INVALID_ARGUMENT,
            "skip_microbatches 4 must be below the 4 microbatches of a step"),
           (dict(state_json=foreign), grpc.StatusCode.FAILED_PRECONDITION,
            "rank 1 of 2 needs lanes 4-7")]
    for overrides, code, message in bad:
        with pytest.raises(grpc.RpcError) as info:
            rd.stub.Open(rd.request(**overrides), timeout=60)
        assert info.value.code() == code and message in info.value.details()
        got += [next(it) for _ in range(5)]
    other.close()
    # far more than a stream can have in flight (64 ring slots, a message, the queue): a
    # closed session would have ended this stream
    got += [next(it) for _ in range(150)]
    good.close()
    assert good.reconnects == 0
    ref = _reference(recipe, 1, 2, 2, len(got))
    assert [(b.step, b.index, b.input_ids.astype("<i4").tobytes(),
             b.positions.astype("<i4").tobytes()) for b in got] == ref
    digests = {b.step: b.lane_digests for b in got if b.lane_digests}
    ref_loader = InProcessLoader(recipe, 1, 2, 8)  # one microbatch a step: every digest
    want = {b.step: b.lane_digests for _, b in zip(range(len(digests)), ref_loader,
                                                   strict=False)}
    ref_loader.close()
    assert digests == want


# -- kept boundaries do not grow with the file count ------------------------------------------

def _tiny_files(root: Path, n: int) -> str:
    root.mkdir()
    for i in range(n):
        (root / f"f{i:05d}.jsonl").write_text("".join(
            json.dumps({"text": f"doc {j} of file {i} " + "abc def ghi " * 5}) + "\n"
            for j in range(3)))
    return str(root / "*.jsonl")


def _text_bytes(value: Any) -> int:
    """Characters of every string a kept value holds (a full checkpoint JSON, or per-lane
    states)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, tuple | list):
        return sum(_text_bytes(v) for v in value)
    if dataclasses.is_dataclass(value):
        return sum(_text_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


def test_kept_boundaries_hold_lane_states_not_the_file_list(tmp_path) -> None:
    """A kept boundary costs its lanes' compact states, whatever the file
    count; the checkpoint JSON it gives is byte for byte the loader's own dump."""
    kept: dict[int, list[int]] = {}
    docs: dict[int, int] = {}
    for n in (10, 2000):
        recipe = load_recipe({
            "lanes": 8, "global_batch_size": 16, "seq_len": 32, "seed": 1,
            "tokenizer": {"uri": tokenizer_path()},
            "sources": [{"name": "tiny", "uris": [_tiny_files(tmp_path / f"n{n}", n)],
                         "epochs": None}],
            "shuffle": {"block_size": 16}})
        plan = Plan.build(recipe)
        docs[n] = len(json.dumps(plan.fingerprint_doc, separators=(",", ":")))
        pool = TaskPool(1)
        # one microbatch a step, nobody reading: the producer runs 4 steps ahead and stops
        session = Session("t", plan, pool, Knobs(workers=1), 0, 1, 16, None, 0, 4)
        try:
            _wait_for(lambda s=session: len(s._boundaries) >= 5, "5 boundaries")
            boundaries = dict(session._boundaries)
            want = _states(recipe, 0, 1, 4)
            kept[n] = []
            for step in range(5):
                text = session.state_at(step)
                if step:
                    assert text == want[step - 1]  # the boundary after step - 1
                lanes = json.loads(text)["lanes"]
                # by hand: the compact JSON of each lane state, nothing else
                assert _text_bytes(boundaries[step]) == sum(
                    len(json.dumps(v, separators=(",", ":"))) for v in lanes.values())
                kept[n].append(_text_bytes(boundaries[step]))
        finally:
            session.close()
            pool.shutdown()
    assert docs[2000] - docs[10] > 100_000  # the file list the boundaries used to carry
    # lane state v2: a packer holding nothing writes no state of its own
    assert kept[10][0] == kept[2000][0] == 8 * len(
        '{"v":2,"lane":0,"seqs":0,"src":[[0,0,0,-1,0]],"mix":[0],"n":[0,0,0,0,{}]}')
    for a, b in zip(kept[10], kept[2000], strict=True):  # digits of file numbers at most
        assert a < 1000 and b < 1000 and abs(a - b) < 64

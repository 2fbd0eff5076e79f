"""A rank worker's calls (:mod:`datalane_sidecar.worker`) served in the test's own process.

The worker's loop reads ``(call, method, args)`` from a pipe; here the pipe is a queue the test
fills and a list of the replies, so each call's answer (or its error as it crosses the pipe)
is checked without a worker process: opening a session, its calls by name, refused names,
notices, rings, gathers, a backfill, and the end of the loop (exit, or the server gone).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from datalane_sidecar import worker
from datalane_sidecar.delivery import Sent

from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.spec.evals import TRAIN
from datalane.spec.knobs import Knobs
from datalane.spec.state import Checkpoint
from tests.sidecar.inproc import tiny_recipe

HID = "a" * 16


class _Pipe:
    """The worker's end of the pipe: ``recv`` takes what the test put, ``send`` records."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.replies: dict[int, tuple[bool, Any]] = {}
        self.cond = threading.Condition()
        self.broken = False

    def recv(self) -> Any:
        got = self.inbox.get(timeout=60)
        if isinstance(got, BaseException):
            raise got
        return got

    def send(self, reply: tuple[int, bool, Any]) -> None:
        if self.broken:
            raise OSError("pipe closed")
        with self.cond:
            self.replies[reply[0]] = (reply[1], reply[2])
            self.cond.notify_all()


class _Exit(BaseException):
    """What ``os._exit`` raises here instead of ending the test process."""


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    return Plan.build(tiny_recipe(tmp_path_factory.mktemp("docs")))


@pytest.fixture
def serve(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A worker serving a pipe on a thread; ``serve.call(method, *args)`` -> (ok, value)."""
    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise _Exit

    monkeypatch.setattr(worker.os, "_exit", fake_exit)
    pipe = _Pipe()
    w = worker._Worker(pipe, {TRAIN: plan}, Knobs(workers=1), 4)  # type: ignore[arg-type]
    calls = iter(range(1, 10_000))

    def run() -> None:
        try:
            w.serve()
        except _Exit:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    class Serve:
        def __init__(self) -> None:
            self.pipe, self.worker, self.thread, self.exits = pipe, w, thread, exits

        def call(self, method: str, *args: Any) -> tuple[bool, Any]:
            call = next(calls)
            pipe.inbox.put((call, method, args))
            with pipe.cond:
                assert pipe.cond.wait_for(lambda: call in pipe.replies, 60), method
                return pipe.replies.pop(call)

        def notice(self, method: str, *args: Any) -> None:
            pipe.inbox.put((None, method, args))

        def ok(self, method: str, *args: Any) -> Any:
            ok, value = self.call(method, *args)
            assert ok, value
            return value

    yield Serve()
    if thread.is_alive():
        pipe.inbox.put((None, "exit", ()))
        thread.join(30)
    w.pool.shutdown(wait=False)


def _open(serve: Any, hid: str = HID, start: Checkpoint | None = None) -> dict[str, Any]:
    reply: dict[str, Any] = serve.ok("open", hid, TRAIN, 0, 1, 4, start, 0, 1, None)
    return reply


def test_an_open_session_answers_its_calls_by_name(serve) -> None:
    assert _open(serve) == {"first_step": 0, "per_step": 2, "lanes": (0, 4)}
    session = serve.worker.sessions[HID]
    assert session.readers == 1 and session.texts is serve.worker.texts[TRAIN]
    assert session._fanout.prefetch == 4
    gen = serve.ok("session", HID, "claim", 0)
    assert gen == 1
    assert serve.ok("session", HID, "sent") is None  # a property, read
    serve.notice("session", HID, "sent_to", 0, gen, (0, 1))
    serve.notice("session", HID, "acked_by", 0, gen, (0, 1))
    assert serve.ok("session", HID, "sent") == (0, 1)  # notices run first, in order
    assert serve.ok("session", HID, "acked") == (0, 1)
    assert serve.ok("session", HID, "attached") == [0]
    serve.notice("session", HID, "detach", 0, gen)
    assert serve.ok("session", HID, "attached") == []


def test_a_call_the_worker_does_not_serve_is_refused_by_name(serve, caplog) -> None:
    _open(serve)
    assert serve.call("session", HID, "close") == (
        False, ("ConfigError", "a rank worker serves no session call 'close'", False))
    assert serve.call("session", "nope", "describe") == (
        False, ("StorageError", "session nope is closed in its rank worker", True))
    with caplog.at_level(logging.WARNING, "datalane.sidecar"):
        serve.notice("session", "nope", "sent_to", 0, 1, (0, 0))  # closed: nothing to record
        serve.notice("session", HID, "loader")
        assert serve.ok("session", HID, "attached") == []
    assert [r.getMessage() for r in caplog.records] == [
        "rank worker: notice session failed: a rank worker serves no session call 'loader'"]


def test_a_gather_sends_inline_or_through_the_readers_ring(serve, tmp_path) -> None:
    _open(serve)
    gen = serve.ok("session", HID, "claim", 0)
    got = serve.ok("gather", HID, None, 0, gen, 10.0)
    assert got and isinstance(got[0], Sent) and (got[0].step, got[0].index) == (0, 0)
    assert got[0].columns is not None and got[0].slot is None
    path = str(tmp_path / "ring.shm")
    assert serve.ok("ring", HID, "r1", path, 4, 0o600) is None
    assert os.path.exists(path) and list(serve.worker.rings) == ["r1"]
    got = serve.ok("gather", HID, "r1", 0, gen, 10.0)
    assert got and got[0].slot is not None and got[0].columns is None
    ring = serve.worker.rings["r1"]
    free = ring.free_slots()
    serve.notice("release", "r1", [got[0].slot])
    serve.notice("release", "gone", [0])  # a ring closed meanwhile: nothing
    assert serve.ok("session", HID, "attached") == [0]
    assert ring.free_slots() == free + 1
    serve.notice("close_ring", "r1")
    assert serve.call("gather", HID, "r1", 0, gen, 1.0) == (
        False, ("RingClosed", "the shared-memory ring of handle r1 was closed", True))
    assert not os.path.exists(path) and serve.worker.rings == {}


def test_a_backfill_answers_once_the_ledger_is_rebuilt(serve, plan) -> None:
    loader = Loader(plan.recipe, 0, 1)
    states, digests = {}, {}
    for s in range(3):
        states[s] = Checkpoint.from_json(loader.state_dict())
        digests[s] = loader.next_step().lane_digests
    loader.close()
    _open(serve, start=states[2])
    assert serve.ok("backfill", HID, 0, states[0]) is None
    assert serve.worker.sessions[HID].backfilled.is_set()
    assert serve.ok("session", HID, "digests_between", 0, 2) == {0: digests[0], 1: digests[1]}


def test_close_and_exit_close_every_session_and_ring(serve, tmp_path) -> None:
    _open(serve)
    _open(serve, "b" * 16)
    path = str(tmp_path / "ring.shm")
    serve.ok("ring", HID, "r1", path, 4, 0o600)
    rss = serve.ok("rss")
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm", encoding="ascii") as f:  # the same process here
        resident = int(f.read().split()[1]) * page
    assert rss % page == 0 and abs(rss - resident) < resident // 10
    assert serve.ok("map_processes") == []  # threads, no map process
    closed = serve.worker.sessions["b" * 16]
    assert serve.ok("close", "b" * 16) is None
    assert list(serve.worker.sessions) == [HID] and closed._stop.is_set()
    assert serve.ok("close", "b" * 16) is None  # twice: nothing
    kept = serve.worker.sessions[HID]
    serve.notice("exit")
    serve.thread.join(30)
    assert not serve.thread.is_alive() and serve.exits == []
    assert serve.worker.sessions == {} and kept._stop.is_set()
    assert serve.worker.rings == {} and not os.path.exists(path)
    assert serve.worker.pool._closed  # its map pool too


@pytest.mark.parametrize("gone", [EOFError(), OSError("bad fd")])
def test_the_worker_exits_when_the_server_is_gone(serve, gone) -> None:
    serve.pipe.inbox.put(gone)
    serve.thread.join(30)
    assert serve.exits == [0]


def test_the_worker_exits_when_it_cannot_answer(serve) -> None:
    serve.pipe.broken = True
    serve.pipe.inbox.put((1, "rss", ()))
    deadline = time.monotonic() + 30
    while not serve.exits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert serve.exits == [0]


def test_main_ignores_the_servers_signals_and_logs_at_its_level(plan, monkeypatch) -> None:
    import pickle
    import signal
    seen: list[Any] = []
    monkeypatch.setattr(worker.signal, "signal", lambda sig, how: seen.append((sig, how)))
    monkeypatch.setattr(worker, "setup_logging", seen.append)
    pipe = _Pipe()
    pipe.inbox.put((None, "exit", ()))
    worker.main(pipe, pickle.dumps({TRAIN: plan}), Knobs(workers=1), 2,  # type: ignore[arg-type]
                "debug")
    assert seen == [(signal.SIGTERM, signal.SIG_IGN), (signal.SIGINT, signal.SIG_IGN), "debug"]
    assert pipe.inbox.empty()  # it served the pipe until told to exit


def test_errors_cross_the_pipe_as_their_own_types() -> None:
    """A StorageError keeps its transient flag; an error of another type becomes a
    RemoteError naming it."""
    from datalane.spec.errors import DataError, StorageError
    for e in (StorageError("down", transient=True), StorageError("gone")):
        back = worker.decode_error(worker.encode_error(e))
        assert type(back) is StorageError and back.transient is e.transient
    assert worker.encode_error(DataError("bad row")) == ("DataError", "bad row", False)
    back = worker.decode_error(("DataError", "bad row", False))
    assert type(back) is DataError and str(back) == "bad row"
    back = worker.decode_error(("KeyError", "'x'", False))
    assert type(back) is worker.RemoteError and str(back) == "KeyError: 'x'"


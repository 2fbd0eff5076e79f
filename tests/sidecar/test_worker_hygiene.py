"""Review finding 8: a rank worker that dies leaves nothing behind in the server.

A worker killed with kill -9 (or one that dies while it starts) held, in the server, its
pipe's end and the two sentinel pipes of its process; they stayed open until an Open of one
of its ranks replaced it (forever, if none came), and a ring the worker was making when it
died was never removed from the pod's tmpfs. The server now closes the pipe, reaps the process
and removes the worker's rings when it notices the death, and a replacement gets new rings.
The same leaks on the paths between making a ring and handing it over are checked here too.

Real worker processes (``forkserver``, as the sidecar starts them), real ring files in
``tmp_path``, the server's descriptors counted in ``/proc/self/fd``.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from datalane_sidecar.boundaries import CheckpointText
from datalane_sidecar.metrics import Metrics
from datalane_sidecar.remote import RankProcesses, RankWorker, RemoteSession, WorkerLost
from datalane_sidecar.service import DataLaneService
from datalane_sidecar.session import Session

from datalane import load_recipe
from datalane.engine.plan import Plan
from datalane.spec.evals import TRAIN
from datalane.spec.knobs import Knobs
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from tests.sidecar.inproc import serve_in_process
from tests.sidecar.test_rank_processes import _alive

pytestmark = pytest.mark.slow  # real forkserver rank workers


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settles(expected: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``expected()`` holds within ``seconds`` (threads of earlier tests may still be
    closing descriptors of their own when a count is taken)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if expected():
            return True
        time.sleep(0.05)
    return expected()


class _Lost:
    """The service's ``on_lost``: which workers were reported dead."""

    def __init__(self) -> None:
        self.workers: list[RankWorker] = []
        self.event = threading.Event()

    def __call__(self, worker: RankWorker) -> None:
        self.workers.append(worker)
        self.event.set()


@pytest.fixture
def plans(repeat_recipe: str) -> dict[str, Plan]:
    return {TRAIN: Plan.build(load_recipe(repeat_recipe))}


@pytest.fixture
def baseline(plans: dict[str, Plan]) -> int:
    """The server's descriptors with no worker: counted after one worker was started and
    stopped, so the forkserver (started once per process, and kept) is in it."""
    RankProcesses(1, plans, Knobs(workers=1), 2, lambda w: None).stop()
    return _fds()


def _open(ranks: RankProcesses, plans: dict[str, Plan], hid: str) -> RemoteSession:
    plan = plans[TRAIN]
    return ranks.open(hid, plan, CheckpointText(plan), TRAIN, 0, 1, 2, None, 0, 1, None)


def test_a_killed_worker_leaves_no_descriptor_and_no_ring(plans, baseline, tmp_path) -> None:
    lost = _Lost()
    ranks = RankProcesses(1, plans, Knobs(workers=1), 2, lost)
    try:
        first = _open(ranks, plans, "a" * 16)
        ring_a = str(tmp_path / "datalane-aaaa.shm")
        first.new_ring("a" * 16, ring_a, 8, 0o600)
        assert os.path.exists(ring_a)
        # the worker's pipe end and its two sentinel pipes
        assert _settles(lambda: _fds() == baseline + 3), (_fds(), baseline)
        pid = ranks.workers[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert lost.event.wait(20)
        assert "killed by signal 9" in (lost.workers[0].lost or "")
        # before any Open replaces it: its pipe closed, its process reaped, its ring removed
        assert _settles(lambda: _fds() == baseline), (_fds(), baseline)
        assert not os.path.exists(ring_a)
        # the replacement: a new process, a new ring of its own
        second = _open(ranks, plans, "b" * 16)
        assert ranks.workers[0].pid not in (None, pid) and ranks.restarts == 1
        ring_b = str(tmp_path / "datalane-bbbb.shm")
        second.new_ring("b" * 16, ring_b, 8, 0o600)
        assert os.path.exists(ring_b) and not os.path.exists(ring_a)
        assert _settles(lambda: _fds() == baseline + 3), (_fds(), baseline)
    finally:
        ranks.stop()
    # a worker stopped with a ring still open: the file goes with it, and every descriptor
    assert not os.path.exists(ring_b)
    assert _settles(lambda: _fds() == baseline), (_fds(), baseline)


class _ExitsWhenLoaded:
    """A plan that ends the worker process while it unpickles its plans (at its start)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return os._exit, (3,)


def test_a_worker_that_dies_while_it_starts_leaves_no_descriptor(baseline) -> None:
    lost = _Lost()
    ranks = RankProcesses(1, {TRAIN: _ExitsWhenLoaded()}, Knobs(workers=1), 2, lost)  # type: ignore[dict-item]
    try:
        assert lost.event.wait(20)
        assert "exited with code 3" in (lost.workers[0].lost or "")
        assert _settles(lambda: _fds() == baseline), (_fds(), baseline)
    finally:
        ranks.stop()
    assert _settles(lambda: _fds() == baseline), (_fds(), baseline)


def test_a_worker_that_cannot_be_started_leaves_no_pipe(plans, baseline) -> None:
    ranks = RankProcesses(1, plans, Knobs(workers=1), 2, lambda w: None)
    ranks.stop()
    assert _settles(lambda: _fds() == baseline), (_fds(), baseline)
    # its arguments do not pickle: Process.start raises after the pipe was made
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        RankWorker(0, ranks._ctx, ranks._plans, lambda: None, 2, lambda w: None)  # type: ignore[arg-type]
    assert _settles(lambda: _fds() == baseline), (_fds(), baseline)


def test_workers_started_before_one_that_fails_are_stopped(plans, baseline,
                                                           monkeypatch) -> None:
    started: list[RankWorker] = []
    start = RankProcesses._start

    def second_fails(self: RankProcesses, index: int) -> RankWorker:
        if index == 1:
            raise OSError("cannot start rank worker 1")
        started.append(start(self, index))
        return started[-1]

    monkeypatch.setattr(RankProcesses, "_start", second_fails)
    with pytest.raises(OSError, match="rank worker 1"):
        RankProcesses(2, plans, Knobs(workers=1), 2, lambda w: None)
    assert len(started) == 1 and started[0].pid is not None
    assert _settles(lambda: not _alive(started[0].pid or 0))
    assert _settles(lambda: _fds() == baseline), (_fds(), baseline)


def _shm_open(stub: pbg.DataLaneStub, reader: int) -> pb.OpenReply:
    reply: pb.OpenReply = stub.Open(pb.OpenRequest(
        protocol_version=PROTOCOL_VERSION, rank=0, world_size=1, microbatch_size=2,
        readers=2, reader=reader, transport=pb.TRANSPORT_SHM, from_start=True), timeout=60)
    return reply


@pytest.mark.parametrize("fails", ["attach", "claim"])
def test_a_ring_made_for_an_open_that_fails_is_removed(repeat_recipe, tmp_path, monkeypatch,
                                                       fails) -> None:
    """The worker dies between making a reader's ring and the reader's attach (claim): the
    Open fails UNAVAILABLE, and the ring it made is not left on the tmpfs. The death is
    played by the session's call raising WorkerLost, as a dead worker's does."""
    plan = Plan.build(load_recipe(repeat_recipe))
    shm = tmp_path / "shm"
    shm.mkdir()
    service = DataLaneService(plan, Knobs(workers=1), 8, None, "pod", 1, str(shm), Metrics())

    def dies(self: Session, *args: Any, **kwargs: Any) -> Any:
        raise WorkerLost("the rank worker process 0 (pid 4242) was killed by signal 9")

    with serve_in_process(service, tmp_path) as sock, grpc.insecure_channel(
            f"unix://{sock}") as channel:
        stub = pbg.DataLaneStub(channel)
        if fails == "attach":
            first = _shm_open(stub, 0)
            assert [p.name for p in shm.iterdir()] == [Path(first.shm_path).name]
        monkeypatch.setattr(Session, fails, dies)
        with pytest.raises(grpc.RpcError) as e:
            _shm_open(stub, 1)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "killed by signal 9" in str(e.value.details())
        expected = [Path(first.shm_path).name] if fails == "attach" else []
        assert [p.name for p in shm.iterdir()] == expected
        monkeypatch.undo()
        for sid in list(service.sessions):
            service._close(sid)

"""Rank worker processes (``--rank-processes``): every rank's sessions in a worker process of
their own, the server routing gRPC, checkpoints and metrics (sidecar/datalane_sidecar/remote.py,
worker.py). The streams stay byte-identical to the in-process mode, the checkpoints and the
ledger as before; a worker killed with kill -9 is a sidecar restart to the trainer.

Real sidecar processes on real Unix sockets (the ``sidecar`` fixture), real stores on
``file://``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import grpc
import pytest
from datalane_sidecar import cli
from datalane_sidecar.delivery import RingClosed
from datalane_sidecar.worker import RemoteError, decode_error, encode_error

from datalane import ConfigError, MismatchError, StorageError, load_recipe
from datalane.client import SidecarLoader
from datalane.spec.errors import DatalaneError
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from tests.sidecar.test_columns import chat_recipe  # noqa: F401  (the fixture)
from tests.sidecar.test_edges import _reference, _same

pytestmark = pytest.mark.slow  # real sidecar processes

PER_STEP = 4  # B = 16, world 2, microbatch 2


def _stats(socket: str) -> dict[str, Any]:
    with grpc.insecure_channel(f"unix://{os.path.abspath(socket)}") as channel:
        reply = pbg.DataLaneStub(channel).Stats(pb.StatsRequest(), timeout=30)
    out: dict[str, Any] = json.loads(reply.json)
    return out


def two_ranks(socket: str) -> tuple[list[SidecarLoader], list[Any]]:
    """Ranks 0 (shared memory) and 1 (inline) of 2 on ``socket``, each reconnecting for up to
    2 minutes, and an iterator over each."""
    loaders = [SidecarLoader(socket, rank=r, world_size=2, microbatch_size=2,
                             transport=("shm", "inline")[r], reconnect_timeout=120)
               for r in (0, 1)]
    return loaders, [iter(loader) for loader in loaders]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_each_rank_streams_from_a_worker_process_of_its_own(sidecar, repeat_recipe) -> None:
    sc = sidecar(repeat_recipe, "--ranks-per-pod", "2", "--rank-processes", "auto")
    recipe = load_recipe(repeat_recipe)
    got: dict[int, list[Any]] = {}
    stats: dict[str, Any] = {}

    def rank(r: int) -> None:
        with SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                           transport="shm" if r == 0 else "inline") as loader:
            it = iter(loader)
            got[r] = [next(it).copy() for _ in range(12)]
            if r == 0:
                stats.update(loader.stats())

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for r in (0, 1):
        _same(got[r], _reference(recipe, r, 2, 2, 12))
    # auto with 2 ranks per pod: two workers, neither of them the server, each alive
    workers = stats["rank_workers"]
    assert sorted(workers) == ["0", "1"]
    pids = {w["pid"] for w in workers.values()}
    assert len(pids) == 2 and sc.proc is not None and sc.proc.pid not in pids
    assert all(_alive(p) for p in pids)
    assert all(w["rss_bytes"] > 10 << 20 for w in workers.values())
    # the server stops its workers when it stops (SIGTERM drains)
    assert sc.terminate() == 0
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_a_chat_recipe_reaches_the_workers_and_streams_its_loss_mask(
        sidecar, chat_recipe) -> None:  # noqa: F811
    """The server plans once and hands its plan to the workers pickled: a chat source's
    compiled template goes as its source and date, compiled again there."""
    sc = sidecar(chat_recipe, "--ranks-per-pod", "2", "--rank-processes", "2")
    recipe = load_recipe(chat_recipe)
    for r, transport in ((0, "shm"), (1, "inline")):
        with SidecarLoader(sc.socket, rank=r, world_size=2, microbatch_size=2,
                           transport=transport) as loader:
            it = iter(loader)
            got = [next(it).copy() for _ in range(12)]
        want = _reference(recipe, r, 2, 2, 12)
        for a, b in zip(got, want, strict=True):
            assert (a.step, a.index, a.lane_digests) == (b.step, b.index, b.lane_digests)
            assert list(a.columns) == ["input_ids", "positions", "loss_mask"]
            for name in b.columns:
                assert a.columns[name].dtype == b.columns[name].dtype
                assert (a.columns[name] == b.columns[name]).all(), name


def test_a_worker_killed_with_kill9_is_a_restart_its_rank_rides_through(
        sidecar, repeat_recipe) -> None:
    """Rank 0's worker is killed mid-step: its trainer re-opens at its position from a new
    worker and sees the uninterrupted stream; rank 1's worker and stream never notice, and
    the server goes on serving. (The chaos test does it with checkpoints and the ledger.)"""
    sc = sidecar(repeat_recipe, "--ranks-per-pod", "2", "--rank-processes", "2")
    recipe = load_recipe(repeat_recipe)
    n = 40 * PER_STEP  # past what the ring (64 slots) and the prefetch hold ahead
    loaders, its = two_ranks(sc.socket)
    got: dict[int, list[Any]] = {0: [], 1: []}
    for r in (0, 1):
        got[r] += [next(its[r]).copy() for _ in range(3 * PER_STEP + 2)]
    before = _stats(sc.socket)["rank_workers"]
    victim = before["0"]["pid"]  # rank 0's worker
    os.kill(victim, signal.SIGKILL)
    for r in (0, 1):
        got[r] += [next(its[r]).copy() for _ in range(n - len(got[r]))]
    after = _stats(sc.socket)["rank_workers"]
    reconnects = [loader.reconnects for loader in loaders]
    for loader in loaders:
        loader.close()
    for r in (0, 1):
        _same(got[r], _reference(recipe, r, 2, 2, n))
    # the kill landed before rank 0 had read ahead past it: its stream broke and re-opened
    assert reconnects[0] >= 1 and reconnects[1] == 0
    assert after["0"]["pid"] != victim and not _alive(victim)
    assert after["1"]["pid"] == before["1"]["pid"]
    assert sc.proc is not None and sc.proc.poll() is None


def test_errors_cross_the_pipe_as_their_own_types() -> None:
    """What the servicer maps to gRPC codes must survive the pipe: the type, the message,
    and a StorageError's transient flag (UNAVAILABLE, retried) against a permanent one."""
    def through(e: BaseException) -> BaseException:
        return decode_error(json.loads(json.dumps(encode_error(e))))

    transient = through(StorageError("store down", transient=True))
    assert type(transient) is StorageError and transient.transient
    assert str(transient) == "store down"
    permanent = through(StorageError("no object", transient=False))
    assert type(permanent) is StorageError and not permanent.transient
    assert type(through(ConfigError("bad step 9"))) is ConfigError
    assert str(through(MismatchError("fingerprint a != b"))) == "fingerprint a != b"
    ring = through(RingClosed("ring closed"))
    assert type(ring) is RingClosed and ring.transient
    other = through(ValueError("x"))
    assert type(other) is RemoteError and str(other) == "ValueError: x"


def test_rank_processes_counts(monkeypatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert cli.rank_processes("0", 8) == 0
    assert cli.rank_processes("3", 8) == 3
    assert cli.rank_processes("8", 2) == 2  # capped at the pod's ranks (about 90 MiB each)
    assert cli.rank_processes("1", 1) == 1
    assert cli.rank_processes("auto", 2) == 2  # one per rank
    assert cli.rank_processes("auto", 8) == 4  # at most one per CPU it may run on
    assert cli.rank_processes("auto", 1) == 0  # a one-rank pod: threads
    for bad in ("-1", "many", ""):
        with pytest.raises(DatalaneError, match="--rank-processes must be 0"):
            cli.rank_processes(bad, 8)

"""Review finding 7: a checkpoint store that hangs must not stop batches from being served.

The sidecar called the store on the thread of the RPC that needed it, with no time limit: an
Open that resumes from a state listed the committed checkpoints (where the ledger starts)
before it replied, so an object store that stopped answering kept a reconnecting rank from
being served at all, and an Open ``from_step`` waited for its load forever. The store's calls
now run on a bounded pool of their own (``datalane.store.calls``), each bounded in time, and
the ledger's start is found after the Open replied.

A real store on ``file://`` behind a wrapper whose reads block until the test ends; a real
service on a Unix socket, the real client.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest
from datalane_sidecar.metrics import Metrics
from datalane_sidecar.service import DataLaneService

from datalane import load_recipe
from datalane.client import SidecarLoader
from datalane.engine.plan import Plan
from datalane.spec.knobs import Knobs
from datalane.store import CheckpointStore
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from tests.sidecar.inproc import serve_in_process
from tests.sidecar.test_edges import _reference, _same

pytestmark = pytest.mark.slow  # real sidecars and rank workers

PER_STEP = 8  # B = 16, world 1, microbatch 2


class _HangingStore:
    """A real store whose reads (listings, existence, loads) hang until ``release``."""

    HANGS = frozenset({"committed_steps", "is_committed", "load", "latest_committed"})

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.release = threading.Event()
        self.hung: list[str] = []  # the calls that hung, in order

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.store, name)
        if name not in self.HANGS:
            return real

        def hangs(*args: Any, **kwargs: Any) -> Any:
            self.hung.append(name)
            self.release.wait(300)
            return real(*args, **kwargs)

        return hangs


@pytest.fixture(params=[0, 1], ids=["threads", "rank-processes"])
def hanging(request, repeat_recipe, tmp_path) -> Any:
    plan = Plan.build(load_recipe(repeat_recipe))
    store = _HangingStore(CheckpointStore(f"file://{tmp_path / 'store'}"))
    shm = tmp_path / "shm"
    shm.mkdir()
    service = DataLaneService(plan, Knobs(workers=1), 8, store, "pod", 1, str(shm), Metrics(),
                              rank_processes=request.param)
    try:
        with serve_in_process(service, tmp_path) as sock:
            yield sock, store, service
    finally:
        store.release.set()
        service.drain()


def test_a_rank_resumed_from_its_state_is_served_while_the_store_hangs(repeat_recipe,
                                                                       hanging) -> None:
    sock, store, _ = hanging
    recipe = load_recipe(repeat_recipe)
    with SidecarLoader(sock, rank=0, world_size=1, microbatch_size=2, transport="shm") as first:
        it = iter(first)
        before = [next(it).copy() for _ in range(2 * PER_STEP)]
        state = first.state_dict()
    assert store.hung == []  # a session from the start needs no ledger start
    got: list[Any] = []
    errors: list[BaseException] = []

    def resumed() -> None:
        try:
            with SidecarLoader(sock, rank=0, world_size=1, microbatch_size=2,
                               transport="shm", open_timeout=20) as loader:
                loader.load_state_dict(state)
                it = iter(loader)
                got.extend(next(it).copy() for _ in range(2 * PER_STEP))
        except BaseException as e:  # handed to the test
            errors.append(e)

    t = threading.Thread(target=resumed, daemon=True)
    t.start()
    t.join(90)
    assert not t.is_alive() and errors == [], errors
    # two steps served after the resumed position while the listing of the committed
    # checkpoints (the ledger's start) still hangs
    assert store.hung == ["committed_steps"] and not store.release.is_set()
    _same(before + got, _reference(recipe, 0, 1, 2, 4 * PER_STEP))


@pytest.fixture
def quick_store(monkeypatch) -> None:
    """The store's calls bounded at 1 s (30 s in a sidecar) for the service built next."""
    monkeypatch.setattr("datalane_sidecar.service.STORE_SECONDS", 1.0, raising=False)


def test_an_open_from_a_step_fails_unavailable_when_the_store_hangs(quick_store,
                                                                   hanging) -> None:
    sock, store, _ = hanging
    t0 = time.monotonic()
    with grpc.insecure_channel(f"unix://{sock}") as channel, pytest.raises(
            grpc.RpcError) as e:
        pbg.DataLaneStub(channel).Open(pb.OpenRequest(
            protocol_version=PROTOCOL_VERSION, rank=0, world_size=1, microbatch_size=2,
            transport=pb.TRANSPORT_INLINE, from_step=4), timeout=20)
    took = time.monotonic() - t0
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    assert (f"the checkpoint store {store.uri} did not answer within 1 s to load the "
            f"checkpoint of step 4") in str(e.value.details())
    assert took < 10 and store.hung == ["load"]

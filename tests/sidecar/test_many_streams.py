"""More streams than the sidecar once had server threads for.

A Stream holds a server thread for its life and a Checkpoint holds one until every rank of the
pod has asked; with a fixed pool of 64 threads, 40 ranks checkpointing together took them all
and the last ranks' Checkpoints and every Health probe queued behind them. Real sidecar
processes on Unix sockets, real checkpoint stores on ``file://``.
"""

from __future__ import annotations

import statistics
import threading
import time
import traceback

import grpc
import pytest

from datalane import ConfigError
from datalane.client import SidecarLoader
from datalane.store import CheckpointStore
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg

pytestmark = pytest.mark.slow  # real sidecar processes

RANKS = 40  # more than 32: 40 streams + 40 checkpoints waiting exceeded the 64 threads
STEPS = 6
EVERY = 2


@pytest.fixture
def wide_recipe(write_recipe, corpus) -> str:
    """40 lanes of one endless Parquet source (60 chunks), one sequence per lane and step."""
    return write_recipe(lanes=RANKS, global_batch_size=RANKS, seq_len=32, sources=[
        {"name": "web", "uris": [corpus.web], "epochs": None, "chunk_rows": 10}])


def _probe(sock: str, stop: threading.Event, latencies: list[float],
           failures: list[str]) -> None:
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = pbg.DataLaneStub(channel)
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                stub.Health(pb.HealthRequest(), timeout=10)
                latencies.append(time.monotonic() - t0)
            except grpc.RpcError as e:
                failures.append(f"{e.code().name}: {e.details()}")
            stop.wait(0.25)


def test_forty_ranks_checkpointing_together_keep_health_and_checkpoints_moving(
        sidecar, wide_recipe, tmp_path) -> None:
    store_uri = str(tmp_path / "store")
    sc = sidecar(wide_recipe, "--store", store_uri, "--ranks-per-pod", str(RANKS))
    errors: list[str] = []
    saved: dict[int, list[int]] = {r: [] for r in range(RANKS)}
    checkpoint_seconds: list[float] = []

    def rank(r: int) -> None:
        try:
            with SidecarLoader(sc.socket, rank=r, world_size=RANKS, microbatch_size=1,
                               transport="inline", open_timeout=120) as loader:
                it = iter(loader)
                for n in range(STEPS):
                    next(it)
                    if (n + 1) % EVERY == 0:
                        t0 = time.monotonic()
                        saved[r].append(loader.checkpoint(timeout=90)["step"])
                        checkpoint_seconds.append(time.monotonic() - t0)
        except BaseException:
            errors.append(f"rank {r}: {traceback.format_exc()}")

    stop = threading.Event()
    latencies: list[float] = []
    failures: list[str] = []
    prober = threading.Thread(target=_probe, args=(sc.socket, stop, latencies, failures))
    prober.start()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    stop.set()
    prober.join(30)
    assert not errors, "\n".join(errors[:3])
    assert all(saved[r] == [2, 4, 6] for r in range(RANKS)), saved
    assert CheckpointStore(store_uri).committed_steps() == [2, 4, 6]
    # every Health probe answered (a kubelet restarts a sidecar whose probes time out)
    assert not failures, failures[:5]
    assert latencies and max(latencies) < 10
    print(f"health p50 {statistics.median(latencies):.3f} s max {max(latencies):.3f} s; "
          f"checkpoint max {max(checkpoint_seconds):.2f} s")


def test_a_stream_past_the_limit_is_refused_at_once_naming_it(sidecar,
                                                              repeat_recipe) -> None:
    sc = sidecar(repeat_recipe, "--max-streams", "2")
    loaders = [SidecarLoader(sc.socket, rank=r, world_size=4, microbatch_size=2,
                             transport="inline") for r in range(3)]
    its = [iter(x) for x in loaders[:2]]
    for it in its:
        next(it)  # two streams are open and held
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"at most 2 stream calls.*--max-streams=2"):
        next(iter(loaders[2]))
    assert time.monotonic() - t0 < 30  # refused, not queued behind the two
    for it in its:
        next(it)  # the two streams still flow
    for x in loaders:
        x.close()
    # once one closed, another stream is admitted
    with SidecarLoader(sc.socket, rank=3, world_size=4, microbatch_size=2,
                       transport="inline") as late:
        assert next(iter(late)).step == 0

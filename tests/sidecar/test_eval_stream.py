"""Eval streams through real sidecar processes.

The recipe of :mod:`tests.engine.test_eval_streams` (4 lanes, B = 8, an eval stream ``heldout`` of 5
steps over 24 short held-out documents). A sidecar serves ``SidecarLoader(stream="heldout")``
next to the training stream: the global eval batch of every step is byte-identical at world
sizes 1, 2 and 3 and equals the in-process one; each iteration is one evaluation of exactly
5 steps; the rank's training session goes on undisturbed, and the eval bytes do not depend on
where training stands; the stream ends with OK after its last microbatch; nothing of it can
be checkpointed.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from datalane.client import InProcessLoader, SidecarLoader
from datalane.corpus import DemoCorpus
from datalane.spec import ConfigError, load_recipe
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from tests.engine.test_eval_streams import (
    STEPS,
    eval_files,  # noqa: F401  (the fixture)
    eval_recipe_dict,
    global_steps,
)
from tests.sidecar.inproc import serve_in_process

pytestmark = pytest.mark.slow  # real sidecar processes


@pytest.fixture
def eval_recipe_path(corpus: DemoCorpus, eval_files: str, tmp_path: Path) -> str:  # noqa: F811
    path = tmp_path / "eval-recipe.yaml"
    path.write_text(yaml.safe_dump(eval_recipe_dict(corpus, eval_files)))
    return str(path)


def _bytes(batches: list[Any]) -> list[bytes]:
    return [b"".join(b.columns[c].tobytes() for c in b.columns) for b in batches]


def _in_process(path: str, rank: int, world: int, microbatch: int,
                stream: str = "heldout") -> list[Any]:
    loader = InProcessLoader(load_recipe(path), rank, world, microbatch, stream=stream)
    try:
        if stream != "train":
            return list(loader)
        it = iter(loader)
        return [next(it).copy() for _ in range(10 * loader.per_step)]
    finally:
        loader.close()


def test_the_global_eval_batch_is_the_same_at_world_sizes_1_2_and_3(
        sidecar: Any, eval_recipe_path: str) -> None:
    sc = sidecar(eval_recipe_path)
    reference = global_steps([_in_process(eval_recipe_path, 0, 1, 1)], 1, 1)
    assert len(reference) == STEPS
    for world in (1, 2, 3):
        per_rank = []
        for rank in range(world):
            with SidecarLoader(sc.socket, rank=rank, world_size=world, microbatch_size=1,
                               stream="heldout",
                               transport="shm" if rank % 2 else "inline") as loader:
                got = list(loader)
                assert loader.steps == STEPS
                assert len(got) == STEPS * loader.per_step  # then the iterator ended
                assert [b.step for b in got[::loader.per_step]] == list(range(STEPS))
            per_rank.append(got)
        assert global_steps(per_rank, world, 1) == reference, f"world size {world}"


def test_training_goes_on_undisturbed_and_its_position_does_not_change_the_eval_bytes(
        sidecar: Any, eval_recipe_path: str) -> None:
    sc = sidecar(eval_recipe_path)
    want_train = _bytes(_in_process(eval_recipe_path, 0, 2, 2, stream="train"))
    want_eval = _bytes(_in_process(eval_recipe_path, 0, 2, 2))
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2) as train, \
            SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=2,
                          stream="heldout") as heldout:
        at_0 = _bytes(list(heldout))  # before any training step
        batches = iter(train)
        got = [next(batches) for _ in range(7 * 2)]  # training steps 0-6
        during = iter(heldout)
        first = next(during)
        streams = sorted((s["stream"], s["rank"])
                         for s in train.stats()["sessions"].values())
        assert streams == [("heldout", 0), ("train", 0)]  # two sessions of rank 0
        at_7 = _bytes([first, *during])
        # the evaluation closed its session; training continues at step 7
        assert [s["stream"] for s in train.stats()["sessions"].values()] == ["train"]
        got += [next(batches) for _ in range(3 * 2)]
        assert train.state_dict()["step"] == 10
    assert at_0 == want_eval and at_7 == want_eval
    assert _bytes(got) == want_train


def test_evaluations_have_metrics_of_their_own(sidecar: Any, eval_recipe_path: str) -> None:
    import re
    import urllib.request

    from tests.sidecar.test_sidecar import _with_metrics

    sc, url = _with_metrics(sidecar, eval_recipe_path)

    def scrape() -> Any:
        text = urllib.request.urlopen(url, timeout=10).read().decode()

        def value(series: str) -> float:
            found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
            assert found is not None, f"{series} is not exported:\n{text}"
            return float(found.group(1))

        return value

    def tokens(batches: list[Any]) -> int:
        return sum(int((b.positions >= 0).sum()) for b in batches)

    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=2,
                       stream="heldout") as heldout:
        evaluated = list(heldout) + list(heldout)  # two evaluations before any training
    value = scrape()
    # an evaluation is not training progress: the training counters have not moved
    assert (value("datalane_microbatches_total"), value("datalane_tokens_total")) == (0, 0)
    assert value('datalane_eval_microbatches_total{stream="heldout"}') == len(evaluated)
    assert value('datalane_eval_tokens_total{stream="heldout"}') == tokens(evaluated) > 0
    assert value("datalane_payload_bytes_total") == sum(b.nbytes for b in evaluated)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=2) as train:
        batches = iter(train)
        trained = [next(batches) for _ in range(7)]
        value = scrape()
    assert value("datalane_microbatches_total") >= len(trained)  # (and the read-ahead)
    assert value("datalane_tokens_total") >= tokens(trained)
    assert value('datalane_eval_microbatches_total{stream="heldout"}') == len(evaluated)


def test_every_iteration_is_one_evaluation_and_restart_goes_back_to_step_0(
        sidecar: Any, eval_recipe_path: str) -> None:
    from datalane.client.torch import DataLaneDataset

    sc = sidecar(eval_recipe_path)
    with SidecarLoader(sc.socket, rank=2, world_size=3, microbatch_size=2,
                       stream="heldout") as loader:
        data = DataLaneDataset(loader)
        first = [item["input_ids"].clone() for item in data]
        assert len(first) == STEPS * 2  # rank 2 of 3: lanes 2-3, 4 sequences a step
        it = iter(loader)
        partial = [next(it) for _ in range(3)]
        loader.restart()
        with pytest.raises(ConfigError):
            next(it)  # retired
        again = list(data)
        assert len(again) == len(first)
        assert all(bool((a == b["input_ids"]).all()) for a, b in zip(first, again, strict=True))
        assert [b.input_ids[:, :-1].astype(np.int64).tobytes() for b in partial] == [
            t.numpy().tobytes() for t in first[:3]]
        for refused in (loader.state_dict, loader.checkpoint):
            with pytest.raises(ConfigError, match="eval stream 'heldout' has no"):
                refused()


def test_an_evaluation_rides_through_a_sidecar_restart(sidecar: Any, corpus: DemoCorpus,
                                                       eval_files: str,  # noqa: F811
                                                       tmp_path: Path) -> None:
    """The sidecar is killed inside step 1 and started again: the evaluation goes on at its
    exact position. The stream is long enough that part of it must come after the restart,
    in either sidecar mode (threads or rank processes) and however fast the sidecar is: over
    shared memory the sidecar places a microbatch only in a free slot of the reader's ring,
    so when the client holds microbatch ``kill_at`` at most a ring (``_SHM_MAX_SLOTS``) plus
    the ``kill_at`` slots it released can have been sent."""
    from datalane_sidecar.service import _SHM_MAX_SLOTS

    kill_at, per_step = 6, 4  # rank 1 of 2, microbatch 1: 4 microbatches a step
    steps = (_SHM_MAX_SLOTS + kill_at) // per_step + 2  # the later steps are padding
    path = tmp_path / "long-eval-recipe.yaml"
    path.write_text(yaml.safe_dump(eval_recipe_dict(corpus, eval_files, steps=steps)))
    sc = sidecar(str(path))
    want = _bytes(_in_process(str(path), 1, 2, 1))
    assert len(want) == steps * per_step > _SHM_MAX_SLOTS + kill_at
    got: list[Any] = []
    with SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=1, transport="shm",
                       stream="heldout") as loader:
        for batch in loader:
            got.append(batch)
            if len(got) == kill_at:  # inside step 1
                sc.kill9()
                sc.start()
        assert loader.reconnects >= 1
    assert _bytes(got) == want


def _stub(socket: str) -> tuple[grpc.Channel, pbg.DataLaneStub]:
    channel = grpc.insecure_channel(f"unix://{os.path.abspath(socket)}")
    return channel, pbg.DataLaneStub(channel)


def _open(stream: str, **resume: Any) -> pb.OpenRequest:
    return pb.OpenRequest(protocol_version=PROTOCOL_VERSION, rank=0, world_size=1,
                          microbatch_size=8, transport=pb.TRANSPORT_INLINE, stream=stream,
                          **(resume or {"from_start": True}))


def test_the_wire_unknown_streams_the_end_of_an_eval_stream_and_no_checkpoints(
        sidecar: Any, eval_recipe_path: str) -> None:
    sc = sidecar(eval_recipe_path)
    channel, stub = _stub(sc.socket)
    with channel:
        for bad, message in (
                (_open("nope"),
                 "no stream is named 'nope'; the recipe's streams are 'train', 'heldout'"),
                (_open("heldout", from_step=0),
                 "eval stream 'heldout' is never checkpointed, so it cannot resume from_step "
                 "0; open it from_start")):
            with pytest.raises(grpc.RpcError) as info:
                stub.Open(bad, timeout=60)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == message
        train = stub.Open(_open(""), timeout=60)  # "" - what an older client sends - trains
        assert (train.stream, train.steps) == ("train", 0)
        reply = stub.Open(_open("heldout"), timeout=60)
        assert (reply.stream, reply.steps, reply.microbatches_per_step) == ("heldout", STEPS, 1)
        assert reply.fingerprint != train.fingerprint  # the eval stream's own
        with pytest.raises(grpc.RpcError) as info:
            stub.Checkpoint(pb.CheckpointRequest(session_id=reply.session_id, step=0),
                            timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "eval stream 'heldout' is never checkpointed" in (info.value.details() or "")
        # the Stream ends by itself, with OK, after the last microbatch
        done = threading.Event()
        items: list[pb.Microbatch] = []

        def acks() -> Any:
            yield pb.Ack(session_id=reply.session_id)
            done.wait(60)

        t0 = time.monotonic()
        for delivery in stub.Stream(acks(), timeout=60):
            items.extend(delivery.items)
        done.set()
        assert time.monotonic() - t0 < 30
        assert [(m.step, m.index) for m in items] == [(s, 0) for s in range(STEPS)]
        assert items[-1].ended and not items[0].ended


def test_a_sidecar_that_predates_eval_streams_is_refused(eval_recipe_path: str,
                                                         tmp_path: Path) -> None:
    """A sidecar without eval streams ignores the request's `stream` (an unknown proto3
    field) and serves the training stream, answering "" and 0: the client must refuse it
    rather than evaluate on training data forever."""

    from datalane_sidecar.metrics import Metrics
    from datalane_sidecar.service import DataLaneService

    from datalane.engine.plan import Plan
    from datalane.spec.errors import MismatchError
    from datalane.spec.knobs import Knobs

    class Older(DataLaneService):
        def Open(self, request: pb.OpenRequest, context: Any) -> pb.OpenReply:
            request.stream = ""  # what it reads of the request
            reply = super().Open(request, context)
            reply.ClearField("stream")
            reply.ClearField("steps")
            return reply

    service = Older(Plan.build(load_recipe(eval_recipe_path)), Knobs(workers=1), 8, None,
                    "pod", 1, str(tmp_path), Metrics())
    with serve_in_process(service, tmp_path) as sock:
        with SidecarLoader(sock, rank=0, world_size=1, microbatch_size=8, transport="inline",
                           stream="heldout") as loader, pytest.raises(MismatchError) as info:
            next(iter(loader))
        assert str(info.value) == (f"the sidecar at {sock} serves stream 'train' to a loader "
                                   f"of stream 'heldout': it predates eval streams; upgrade it")
        with SidecarLoader(sock, rank=0, world_size=1, microbatch_size=8,
                           transport="inline") as train:
            assert next(iter(train)).step == 0  # training through it is unchanged

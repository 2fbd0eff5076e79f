"""The real client against fake sidecars of other wire versions: clear refusals, no garbage.

A fake servicer (in this process, on a real Unix socket) answers as a sidecar of protocol 1
would, or as a protocol-2 sidecar whose announcement or payload is wrong. The client must name
both versions and the side to upgrade, or the column that does not fit the announced layout,
and never hand the trainer misread bytes. (The sidecar's side, a v1 OpenRequest against a real
sidecar, is in tests/sidecar/test_sidecar.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from datalane.client import SidecarLoader
from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, SampleSchema, text_schema
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from datalane.wire.layout import Layout, announce_schema

SEQ = 5
SCHEMA = text_schema(0, extra=(Column("loss_mask", "uint8", 0, default=1),))


class FakeSidecar(pbg.DataLaneServicer):
    """Answers Health and Open as told; streams ``items`` (inline) once."""

    def __init__(self, version: int, announce: bool = True,
                 items: list[pb.Microbatch] | None = None, schema: SampleSchema = SCHEMA) -> None:
        self.version, self.announce, self.items = version, announce, items or []
        self.schema = schema
        self.closed: list[str] = []

    def Health(self, request: pb.HealthRequest, context: Any) -> pb.HealthReply:
        reply = pb.HealthReply(serving=True, protocol_version=self.version, lanes=2,
                               fingerprint="f" * 64)
        if self.announce:
            announce_schema(reply, self.schema)
        return reply

    def Open(self, request: pb.OpenRequest, context: Any) -> pb.OpenReply:
        reply = pb.OpenReply(session_id="s1", protocol_version=self.version, step=0,
                             lane_start=0, lane_stop=2, seq_tokens=SEQ,
                             microbatches_per_step=2, fingerprint="f" * 64, readers=1)
        if self.announce:
            Layout.of(self.schema, request.microbatch_size, SEQ).announce(reply)
        return reply

    def Stream(self, request_iterator: Iterator[pb.Ack], context: Any) -> Iterator[pb.Delivery]:
        next(request_iterator)
        yield pb.Delivery(items=self.items)
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the fake has nothing more")

    def Close(self, request: pb.CloseRequest, context: Any) -> pb.CloseReply:
        self.closed.append(request.session_id)
        return pb.CloseReply()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[[FakeSidecar], str]]:
    servers: list[grpc.Server] = []

    def serve(servicer: FakeSidecar) -> str:
        socket = str(tmp_path / f"fake{len(servers)}.sock")
        server = grpc.server(futures.ThreadPoolExecutor(4))
        pbg.add_DataLaneServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
        servers.append(server)
        return socket

    yield serve
    for s in servers:
        s.stop(0)


def _loader(socket: str) -> SidecarLoader:
    return SidecarLoader(socket, rank=0, world_size=1, microbatch_size=2, transport="inline",
                         open_timeout=10)


def test_a_protocol_1_sidecar_is_refused_at_open_and_health(fake) -> None:
    servicer = FakeSidecar(version=1, announce=False)
    loader = _loader(fake(servicer))
    want = (r"the sidecar at .*fake0\.sock: the trainer's client speaks datalane wire protocol "
            r"2, the sidecar speaks protocol 1: upgrade the sidecar \(its image\)")
    with pytest.raises(MismatchError, match=want):
        next(iter(loader))
    assert servicer.closed == ["s1"]  # the session it opened is not left behind
    with pytest.raises(MismatchError, match=want):
        _ = loader.lanes_total
    with pytest.raises(MismatchError, match=want):
        _ = loader.schema
    loader.close()


def test_a_newer_sidecar_says_to_upgrade_the_trainer(fake) -> None:
    loader = _loader(fake(FakeSidecar(version=PROTOCOL_VERSION + 1)))
    with pytest.raises(MismatchError, match=r"speaks datalane wire protocol 2, the sidecar "
                                            r"speaks protocol 3: upgrade the trainer's "
                                            r"datalane package"):
        next(iter(loader))
    loader.close()


def test_a_sidecar_that_announces_no_schema_is_refused(fake) -> None:
    loader = _loader(fake(FakeSidecar(version=PROTOCOL_VERSION, announce=False)))
    with pytest.raises(MismatchError, match=r"the reply to Open of the sidecar at .* announces "
                                            r"no sample schema: the sidecar predates wire "
                                            r"protocol 2"):
        next(iter(loader))
    with pytest.raises(MismatchError, match=r"the Health of the sidecar at .* announces no "
                                            r"sample schema"):
        _ = loader.schema
    loader.close()


def test_a_sidecar_that_announces_images_without_the_vision_contract(fake) -> None:
    """An older sidecar: per-image columns but no vision contract. The client still reads the
    columns as they are; VLM mode, which needs the contract, is refused naming the sidecar and
    what is missing."""
    pytest.importorskip("torch")
    from datalane.client.torch import DataLaneDataset

    old = SampleSchema((*SCHEMA.columns, *imagecolumns.columns(768, 2)))
    socket = fake(FakeSidecar(PROTOCOL_VERSION, schema=old))
    loader = _loader(socket)
    assert loader.schema == old and loader.schema.vision is None
    with pytest.raises(MismatchError, match=(
            rf"the sample schema the sidecar at {socket} announces has the per-image columns "
            rf"\['image_patches', 'image_grid_thw', 'image_seq', 'image_offset', "
            rf"'image_patch_start'\] but no vision contract: the ids image_id, video_id, "
            rf"vision_start_id, vision_end_id, pad_id and the patch rule \(patch_size, "
            rf"temporal_patch_size, merge_size, order, image_mean, image_std\) that "
            rf"TorchTitan's multimodal batch needs\. A sidecar that announces images without it "
            rf"predates it: upgrade the sidecar")):
        DataLaneDataset(loader, vlm=True)
    loader.close()


def _microbatch(index: int, columns: list[bytes], sequences: int = 2) -> pb.Microbatch:
    return pb.Microbatch(step=0, index=index, sequences=sequences, columns=columns)


def test_the_client_reads_every_announced_column_and_refuses_a_short_one(fake) -> None:
    ids = np.arange(10, dtype="<i4").reshape(2, SEQ)
    pos = np.array([[0, 1, 2, -1, -1], [0, 1, 0, 1, 2]], dtype="<i4")
    mask = np.array([[0, 0, 1, 0, 0], [1, 1, 1, 0, 1]], dtype=np.uint8)
    good = [ids.tobytes(), pos.tobytes(), mask.tobytes()]
    short = [ids.tobytes(), pos.tobytes(), mask.tobytes()[:9]]
    loader = _loader(fake(FakeSidecar(PROTOCOL_VERSION, items=[_microbatch(0, good),
                                                               _microbatch(1, short)])))
    assert loader.schema == SCHEMA  # from Health, before any session
    it = iter(loader)
    batch = next(it)
    assert list(batch.columns) == ["input_ids", "positions", "loss_mask"]
    assert batch.schema == SCHEMA and loader.schema == SCHEMA
    assert batch.columns["loss_mask"].dtype == np.uint8
    assert np.array_equal(batch.columns["loss_mask"], mask)
    assert np.array_equal(batch.input_ids, ids) and np.array_equal(batch.positions, pos)
    with pytest.raises(MismatchError, match=r"a microbatch from the sidecar at .*: column "
                                            r"'loss_mask' has 9 bytes; the layout announced 10"):
        next(it)
    loader.close()


def test_a_microbatch_of_another_size_than_announced_is_refused(fake) -> None:
    ids = np.zeros((1, SEQ), dtype="<i4")
    one_row = [ids.tobytes(), ids.tobytes(), ids.astype(np.uint8).tobytes()]
    loader = _loader(fake(FakeSidecar(PROTOCOL_VERSION, items=[_microbatch(0, one_row, 1)])))
    with pytest.raises(MismatchError, match=r"\(step 0, index 0\) has 1 sequences; the layout "
                                            r"announced 2"):
        next(iter(loader))
    loader.close()

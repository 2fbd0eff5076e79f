"""The vision contract on the wire (datalane/wire/layout.py, datalane.proto's VisionContract):
a vision schema's replies to Open and Health carry it and the client reads it back checked; a
text schema's replies are the bytes they were before it existed; a client built before it
reads a vision reply's columns as it always did."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, text_schema
from datalane.spec.visioncontract import VisionContract
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire.layout import Layout, announce_schema, announced_schema

LOSS_MASK = Column("loss_mask", "uint8", 0, default=1)
CONTRACT = VisionContract(1024, -1, 1026, 1027, 1, 16, 2, 2, "block", (0.48145466, 0.4578275,
                                                                          0.40821073),
                          (0.26862954, 0.26130258, 0.27577711))
VISION = text_schema(1, (LOSS_MASK, *imagecolumns.columns(768, 2)), CONTRACT)
TEXT = text_schema(1, (LOSS_MASK,))


def _wire(reply: Any) -> Any:
    return type(reply).FromString(reply.SerializeToString())


def test_the_contract_round_trips_through_open_and_health_exactly() -> None:
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION)
    Layout.of(VISION, 2, 64).announce(reply)
    got = Layout.announced(_wire(reply), "the reply")
    assert got == Layout.of(VISION, 2, 64) and got.schema.vision == CONTRACT
    assert got.schema.vision.image_std == (0.26862954, 0.26130258, 0.27577711)  # doubles: exact
    assert reply.vision.video_id == -1 and reply.vision.image_mean[0] == 0.48145466
    health = pb.HealthReply(protocol_version=PROTOCOL_VERSION)
    announce_schema(health, VISION)
    assert announced_schema(_wire(health), "the Health") == VISION


def test_a_text_schemas_replies_are_the_bytes_they_were() -> None:
    """No `vision` field: the reply is what the announcement wrote before the contract (the
    three fields built by hand, as the code before it did)."""
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION, session_id="s")
    Layout.of(TEXT, 2, 5).announce(reply)
    assert not reply.HasField("vision")
    before = pb.OpenReply(protocol_version=PROTOCOL_VERSION, session_id="s",
                          schema_json=TEXT.dumps(), slot_bytes=reply.slot_bytes)
    for f in Layout.of(TEXT, 2, 5).fields:
        before.layout.add(name=f.column.name, dtype=f.column.dtype, offset=f.offset,
                          nbytes=f.nbytes, shape=list(f.shape))
    assert reply.SerializeToString() == before.SerializeToString()
    health = pb.HealthReply(serving=True, protocol_version=PROTOCOL_VERSION, lanes=2)
    announce_schema(health, TEXT)
    assert health.SerializeToString() == pb.HealthReply(
        serving=True, protocol_version=PROTOCOL_VERSION, lanes=2,
        schema_json=TEXT.dumps()).SerializeToString()
    assert announced_schema(_wire(health), "the Health").vision is None


def test_a_client_that_predates_the_contract_reads_a_vision_reply_as_before() -> None:
    """The proto without `vision` (and its message): what an older client's stubs are. It
    parses a vision recipe's reply, skipping the field, to the same schema and layout."""
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    for message in proto.message_type:
        for f in [f for f in message.field if f.name == "vision"]:
            message.field.remove(f)
    proto.message_type.remove(next(m for m in proto.message_type
                                   if m.name == "VisionContract"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    old_open = message_factory.GetMessageClass(pool.FindMessageTypeByName("datalane.v1.OpenReply"))
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION)
    Layout.of(VISION, 2, 64).announce(reply)
    old = old_open.FromString(reply.SerializeToString())
    assert "vision" not in old.DESCRIPTOR.fields_by_name
    assert old.schema_json == VISION.dumps() and old.slot_bytes == reply.slot_bytes
    assert [(f.name, f.offset, list(f.shape)) for f in old.layout] == [
        (f.name, f.offset, list(f.shape)) for f in reply.layout]


@pytest.mark.parametrize("change,message", [
    ({"patch_size": 14}, r"the reply: schema_json: column 'image_patches' has rows of 768 "
                         r"bytes, 4 to a placeholder; the vision contract's patch_size 14"),
    ({"pad_id": 0}, r"column 'input_ids' is padded with 1; the vision contract's pad_id is 0"),
    ({"image_id": 1026}, r"the reply: vision: image_id, vision_start_id and vision_end_id "
                         r"\(1026, 1026, 1027\) must be three different tokens"),
    ({"image_id": 1 << 40}, r"the reply: vision: image_id 1099511627776 is not a token id"),
    ({"image_id": 1, "pad_id": 1}, r"the reply: vision: pad_id 1 is also image_id"),
    ({"video_id": 1027}, r"the reply: vision: video_id 1027 is also vision_end_id"),
    ({"image_std": [0.5, 5e-324, 0.5]}, r"the reply: vision: image_std \(0\.5, 5e-324, 0\.5\) "
                                        r"has a value below 1e-06"),
    ({"image_mean": [1e308, 0.5, 0.5]}, r"the reply: vision: image_mean \(1e\+308, 0\.5, 0\.5\) "
                                        r"has a value outside -1e\+06\.\.1e\+06"),
    ({"merge_size": 0}, r"the reply: vision: merge_size 0 is not an integer in 1\.\.16"),
    ({"order": ""}, r"the reply: vision: order '' is not 'block' or 'raster'"),
    ({"order": "x" * 10_000}, r"the reply: vision: order 'x{39} is not 'block' or 'raster'$"),
    ({"image_mean": [0.5] * 10_000}, r"the reply: vision: image_mean \(0\.5, 0\.5, .{50,70} is "
                                     r"not three finite numbers \(R, G, B\)$"),
    ({"image_mean": [0.5, 0.5]}, r"the reply: vision: image_mean \(0\.5, 0\.5\) is not three "
                                 r"finite numbers"),
    ({"image_std": [0.5, float("inf"), 0.5]}, r"image_std \(0\.5, inf, 0\.5\) is not three "
                                              r"finite numbers"),
    ({"image_std": [0.5, -0.5, 0.5]}, r"the reply: vision: image_std \(0\.5, -0\.5, 0\.5\) has a "
                                      r"value that is not positive"),
])
def test_a_malformed_contract_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION)
    Layout.of(VISION, 2, 64).announce(reply)
    for name, value in change.items():
        if isinstance(value, list):
            del getattr(reply.vision, name)[:]
            getattr(reply.vision, name).extend(value)
        else:
            setattr(reply.vision, name, value)
    with pytest.raises(MismatchError, match=message):
        Layout.announced(_wire(reply), "the reply")


def test_a_contract_beside_a_text_schema_is_refused() -> None:
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION)
    Layout.of(TEXT, 2, 5).announce(reply)
    reply.vision.CopyFrom(pb.VisionContract(**CONTRACT.to_dict()))
    with pytest.raises(MismatchError, match=r"schema_json: a sample schema without per-image "
                                            r"columns has a vision contract"):
        Layout.announced(_wire(reply), "the reply")

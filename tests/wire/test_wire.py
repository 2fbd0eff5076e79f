"""The committed gRPC stubs are exactly what the proto generates; the announced layout and the
shared-memory ring carry typed columns by hand-computed offsets; malformed announcements and
payloads are refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, text_schema
from datalane.wire import PROTOCOL_VERSION, protocol_mismatch
from datalane.wire import datalane_pb2 as pb
from datalane.wire.generate import OUTPUTS, ROOT, generate
from datalane.wire.layout import Layout
from datalane.wire.shm import ShmReader, ShmWriter

# input_ids and positions (int32), a chat recipe's loss mask (uint8) and a per-sequence int64
SCHEMA = text_schema(7, extra=(Column("loss_mask", "uint8", 0, default=1),
                               Column("doc_count", "int64", 0, per_token=False)))


def _columns(rows: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.arange(rows * seq, dtype=np.int32).reshape(rows, seq) + 100
    return {"input_ids": ids, "positions": -ids,
            "loss_mask": (ids % 2).astype(np.uint8),
            "doc_count": np.arange(rows, dtype=np.int64) + (1 << 40)}


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    for path in fresh:
        committed = ROOT / "datalane" / "wire" / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale: run `python -m datalane.wire.generate` and commit")
    assert sorted(p.name for p in fresh) == sorted(OUTPUTS)


def test_protocol_2_retires_the_two_int32_fields() -> None:
    assert PROTOCOL_VERSION == 2
    fields = pb.Microbatch.DESCRIPTOR.fields_by_name
    assert "input_ids" not in fields and "positions" not in fields
    assert fields["columns"].number == 11
    assert {f.name for f in pb.OpenReply.DESCRIPTOR.fields} >= {"schema_json", "layout",
                                                              "slot_bytes"}


def test_the_layout_of_one_microbatch_by_hand() -> None:
    # 1 row of 3 tokens: input_ids 12 bytes at 0, positions at 16 (8-byte aligned), the mask's
    # 3 bytes at 32, the int64 at 40 (not 35), 48 bytes in all
    layout = Layout.of(SCHEMA, 1, 3)
    assert [(f.column.name, f.offset, f.nbytes, f.shape) for f in layout.fields] == [
        ("input_ids", 0, 12, (1, 3)), ("positions", 16, 12, (1, 3)),
        ("loss_mask", 32, 3, (1, 3)), ("doc_count", 40, 8, (1,))]
    assert layout.slot_bytes == 48 and layout.rows == 1


def test_the_announcement_round_trips_through_an_open_reply() -> None:
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION)
    Layout.of(SCHEMA, 2, 5).announce(reply)
    wire = pb.OpenReply.FromString(reply.SerializeToString())
    assert [(f.name, f.dtype, f.offset, f.nbytes, list(f.shape)) for f in wire.layout] == [
        ("input_ids", "int32", 0, 40, [2, 5]), ("positions", "int32", 40, 40, [2, 5]),
        ("loss_mask", "uint8", 80, 10, [2, 5]), ("doc_count", "int64", 96, 16, [2])]
    assert wire.slot_bytes == 112
    got = Layout.announced(wire, "the reply")
    assert got == Layout.of(SCHEMA, 2, 5)
    assert got.schema.column("loss_mask").default == 1


def _reply(**change: object) -> pb.OpenReply:
    reply = pb.OpenReply(protocol_version=PROTOCOL_VERSION)
    Layout.of(SCHEMA, 2, 5).announce(reply)
    for key, value in change.items():
        name, _, attr = key.partition("__")
        if attr:
            setattr(next(f for f in reply.layout if f.name == name), attr, value)
        else:
            setattr(reply, name, value)
    return reply


@pytest.mark.parametrize("change,message", [
    ({"schema_json": ""}, r"announces no sample schema: the sidecar predates wire protocol 2"),
    ({"schema_json": "[{"}, r"schema_json is not valid JSON"),
    ({"loss_mask__name": "mask"}, r"lays out the columns \['input_ids', 'positions', 'mask', "
                                  r"'doc_count'\]; its schema has \[.*'loss_mask'"),
    ({"loss_mask__dtype": "int32"}, r"column 'loss_mask' is laid out as 'int32'; the schema "
                                    r"says 'uint8'"),
    ({"positions__nbytes": 44}, r"column 'positions' has 44 bytes; int32\[2, 5\] is 40"),
    ({"positions__offset": 36}, r"column 'positions' at byte 36 overlaps the column before it "
                                r"\(which ends at 40\)"),
    ({"doc_count__offset": 100}, r"'doc_count' starts at byte 100, not a multiple of its item "
                                 r"size 8"),
    ({"slot_bytes": 100}, r"lays out 112 bytes in a slot of 100"),
])
def test_a_malformed_announcement_is_refused_by_name(change: dict[str, object],
                                                     message: str) -> None:
    with pytest.raises(MismatchError, match=r"the reply.*" + message):
        Layout.announced(_reply(**change), "the reply")


def test_a_column_of_another_shape_is_refused() -> None:
    reply = _reply()
    del reply.layout[1].shape[:]
    reply.layout[1].shape.extend([2, 4])
    reply.layout[1].nbytes = 32
    with pytest.raises(MismatchError, match=r"columns of different shapes: \[\[2, 5\], "
                                            r"\[2, 4\]"):
        Layout.announced(reply, "the reply")


def test_inline_buffers_round_trip_and_a_short_one_is_refused() -> None:
    layout = Layout.of(SCHEMA, 2, 5)
    cols = _columns(2, 5)
    payloads = layout.pack(cols)
    assert [len(p) for p in payloads] == [40, 40, 10, 16]
    assert payloads[2] == bytes([0, 1] * 5)  # uint8 on the wire, not int32
    got = layout.unpack(payloads, "microbatch 3")
    for name, a in cols.items():
        assert got[name].dtype == a.dtype and np.array_equal(got[name], a)
    with pytest.raises(MismatchError, match=r"microbatch 3: column 'loss_mask' has 9 bytes; "
                                            r"the layout announced 10"):
        layout.unpack([payloads[0], payloads[1], payloads[2][:9], payloads[3]], "microbatch 3")
    with pytest.raises(MismatchError, match=r"microbatch 3 carries 2 column buffers; the layout "
                                            r"has 4"):
        layout.unpack(payloads[:2], "microbatch 3")
    with pytest.raises(ValueError, match=r"columns \['input_ids', 'positions'\] are not the "
                                         r"schema's"):
        layout.pack({k: cols[k] for k in ("input_ids", "positions")})


def test_shm_ring_slots_hold_typed_columns_and_wait_for_release(tmp_path: Path) -> None:
    layout = Layout.of(SCHEMA, 1, 3)  # 48-byte slots (offsets 0, 16, 32, 40)
    writer = ShmWriter(str(tmp_path / "ring"), slots=2, layout=layout)
    reader = ShmReader(writer.path, writer.size, layout)
    assert writer.size == 96 and reader.slots == 2
    cols = _columns(1, 3)
    a = writer.acquire(timeout=1)
    b = writer.acquire(timeout=1)
    assert {a, b} == {0, 1}
    assert writer.acquire(timeout=0.05) is None  # full until the reader releases
    off = writer.write(1, cols)
    assert off == 48
    raw = Path(writer.path).read_bytes()[48:96]  # the slot's bytes at the hand-computed places
    assert raw[0:12] == cols["input_ids"].astype("<i4").tobytes()
    assert raw[16:28] == cols["positions"].astype("<i4").tobytes()
    assert raw[32:35] == bytes([0, 1, 0])
    assert raw[40:48] == (1 << 40).to_bytes(8, "little")
    got = reader.columns(off)
    assert list(got) == ["input_ids", "positions", "loss_mask", "doc_count"]
    for name, want in cols.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        assert np.array_equal(got[name], want)
        assert not got[name].flags.writeable
    writer.release([a])
    assert writer.acquire(timeout=1) == a
    with pytest.raises(MismatchError, match=r"slot at byte 96 of a 96-byte ring with slots of "
                                            r"48 bytes"):
        reader.columns(96)
    with pytest.raises(MismatchError, match=r"slot at byte 24 "):
        reader.columns(24)
    del got
    reader.close()
    writer.close()
    assert not Path(writer.path).exists()


def test_protocol_mismatch_names_both_versions_and_the_side_to_upgrade() -> None:
    old_client = protocol_mismatch(1, 2)
    assert "client speaks datalane wire protocol 1, the sidecar speaks protocol 2" in old_client
    assert "upgrade the trainer's datalane package" in old_client
    old_sidecar = protocol_mismatch(2, 1)
    assert "protocol 2, the sidecar speaks protocol 1" in old_sidecar
    assert "upgrade the sidecar" in old_sidecar

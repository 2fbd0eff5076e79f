"""The committed gRPC stubs are exactly what the proto generates; the announced layout and the
shared-memory ring carry typed columns by hand-computed offsets; malformed announcements and
payloads are refused by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, SampleSchema, text_schema
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


def test_a_layout_is_an_immutable_value() -> None:
    """A session's layout is shared by its readers and rings: frozen, hashable by value."""
    layout = Layout.of(SCHEMA, 1, 3)
    assert hash(layout) == hash(Layout.of(SCHEMA, 1, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.slot_bytes = 64  # type: ignore[misc]


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


def _reshaped(name: str, shape: list[int], nbytes: int) -> pb.OpenReply:
    reply = _reply()
    f = next(f for f in reply.layout if f.name == name)
    del f.shape[:]
    f.shape.extend(shape)
    f.nbytes = nbytes
    return reply


def test_a_column_of_other_rows_is_refused() -> None:
    """Every column of a microbatch has its rows: positions of 3 rows beside input_ids of 2
    is refused (before the bytes it would overlap are looked at)."""
    with pytest.raises(MismatchError, match=r"^the reply lays out columns of different "
                                            r"shapes: \[\[2, 5\], \[3, 5\], \[2, 5\], \[2\]\]$"):
        Layout.announced(_reshaped("positions", [3, 5], 60), "the reply")


@pytest.mark.parametrize(("name", "shape", "nbytes", "message"), [
    ("positions", [10], 40, r"column 'positions' has the shape \[10\]; this per-token column "
                            r"has 2 dimensions$"),
    ("doc_count", [2, 1], 16, r"column 'doc_count' has the shape \[2, 1\]; this per-sequence "
                              r"column has 1 dimensions$"),
])
def test_a_column_of_another_number_of_dimensions_is_refused(name: str, shape: list[int],
                                                             nbytes: int, message: str) -> None:
    """A per-token column is (rows, tokens), a per-sequence one (rows,): the same bytes in
    another number of dimensions are refused, naming the kind of column."""
    with pytest.raises(MismatchError, match=r"^the reply: " + message):
        Layout.announced(_reshaped(name, shape, nbytes), "the reply")


def test_a_layout_of_empty_columns_is_refused_and_one_row_is_not_empty() -> None:
    """Microbatches of 2 rows of 0 tokens hold nothing: refused; 1 row of 3 tokens is read
    back as announced."""
    reply = _reply()
    for f in reply.layout[:3]:  # the per-token columns: [2, 0], 0 bytes
        del f.shape[1:]
        f.shape.append(0)
        f.nbytes = 0
    with pytest.raises(MismatchError, match=r"^the reply lays out empty columns: \[2, 0\]$"):
        Layout.announced(reply, "the reply")
    one = pb.OpenReply()
    Layout.of(SCHEMA, 1, 3).announce(one)
    assert Layout.announced(one, "the reply") == Layout.of(SCHEMA, 1, 3)


def test_the_client_refuses_microbatches_of_other_rows_than_it_asked_for() -> None:
    """A layout of 2-row microbatches serves a loader that asked for 2, not 3."""
    layout = Layout.of(SCHEMA, 2, 5)
    layout.check_client(2, "the reply")
    with pytest.raises(MismatchError, match=r"^the reply lays out microbatches of 2 sequences; "
                                            r"this loader asked for 3$"):
        layout.check_client(3, "the reply")


@pytest.mark.parametrize(("positions", "name"), [
    (Column("positions", "int64", -1, fill="position"), "positions"),  # another dtype
    (Column("positions", "int32", -1, per_token=False), "positions"),  # per sequence
    (Column("segment", "int32", 0), "positions"),  # none at all
])
def test_the_client_refuses_a_schema_without_int32_per_token_ids_and_positions(
        positions: Column, name: str) -> None:
    """Every recipe has input_ids and positions, int32 and per token: a schema whose
    positions are int64, per sequence or missing is refused naming the column."""
    schema = SampleSchema((Column("input_ids", "int32", 0), positions))
    with pytest.raises(MismatchError, match=rf"^the reply announces a schema without the int32 "
                                            rf"per-token column '{name}' every recipe has: "):
        Layout.of(schema, 2, 5).check_client(2, "the reply")


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


def test_the_refusal_shows_the_first_200_characters_of_the_schema() -> None:
    """A schema announced without positions is shown, cut to its first 200 characters (the
    JSON of these 4 columns is 361)."""
    schema = SampleSchema(tuple(Column(name, "int32", 0) for name in
                                ("input_ids", "segment", "document", "turn")))
    with pytest.raises(MismatchError) as info:
        Layout.of(schema, 2, 5).check_client(2, "the reply")
    assert len(schema.dumps()) == 361
    assert str(info.value) == ("the reply announces a schema without the int32 per-token column "
                               "'positions' every recipe has: " + schema.dumps()[:200])


def test_columns_of_another_shape_are_not_packed() -> None:
    """pack() takes each column in the layout's shape only: positions of 2 x 4 tokens where
    the layout has 2 x 5 are refused, naming both shapes."""
    cols = _columns(2, 5)
    cols["positions"] = cols["positions"][:, :4]
    with pytest.raises(ValueError, match=r"^column 'positions' has the shape \[2, 4\]; the layout "
                                         r"has \[2, 5\]$"):
        Layout.of(SCHEMA, 2, 5).pack(cols)


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

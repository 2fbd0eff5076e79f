"""Hostile Arrow IPC files and save_to_disk directories: message headers that claim negative
or impossible lengths and row counts, string offsets outside their buffers, values over the
record bound, index files that name files outside the dataset. Each is a DataError or
ConfigError naming the file and the message or batch, or a counted ``too_large`` record,
and quickly (every read runs under a wall bound)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datalane import ConfigError, DataError
from datalane.engine.plan import Plan
from datalane.spec.limits import MAX_RECORD_BYTES
from tests.data.format_corpus import text_of
from tests.support.arrowbytes import messages
from tests.support.common import bounded, drain, expected, fail_message, one_lane

GOOD = [text_of("hf", i) for i in range(6)]


def _stream(path: Path, batches: list[list[str]]) -> bytes:
    with pa.ipc.new_stream(str(path), pa.schema([("text", pa.string())])) as w:
        for texts in batches:
            w.write_batch(pa.record_batch([pa.array(texts, pa.string())], names=["text"]))
    return path.read_bytes()


def _plan_error(path: Path, **source: object) -> str:
    with pytest.raises(DataError) as info:
        bounded(lambda: Plan.build(one_lane([str(path)], **source)), 20)  # type: ignore[arg-type]
    return str(info.value)


def test_a_negative_body_length_stops_the_walk_naming_the_message(tmp_path: Path) -> None:
    # the body length that brings the walk back to the same message: it used to spin forever
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3], GOOD[3:]]))
    batch = messages(bytes(raw))[2]
    assert batch.kind == 3 and batch.body_field is not None
    struct.pack_into("<q", raw, batch.body_field, -(8 + batch.length))
    path.write_bytes(bytes(raw))
    assert f"{path}: the Arrow message at byte {batch.at} has the body length " \
           f"{-(8 + batch.length)}, which is no byte count" in _plan_error(path)


def test_a_negative_metadata_length_names_the_message(tmp_path: Path) -> None:
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3], GOOD[3:]]))
    batch = messages(bytes(raw))[1]
    struct.pack_into("<i", raw, batch.at + 4, -16)
    path.write_bytes(bytes(raw))
    assert f"{path}: the Arrow message at byte {batch.at} has the metadata length -16" in \
        _plan_error(path)


@pytest.mark.parametrize("rows", [-1, 1 << 40])
def test_a_row_count_the_body_cannot_hold_names_the_batch(tmp_path: Path, rows: int) -> None:
    # 2**40 rows in chunks of 25 made a plan of 44 billion chunks
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3], GOOD[3:]]))
    batch = messages(bytes(raw))[1]
    assert batch.rows_field is not None
    struct.pack_into("<q", raw, batch.rows_field, rows)
    path.write_bytes(bytes(raw))
    assert f"{path}: the record batch at byte {batch.at} has the row count {rows}" in \
        _plan_error(path, chunk_rows=25)


def test_flatbuffer_offsets_outside_the_metadata_name_the_message(tmp_path: Path) -> None:
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3], GOOD[3:]]))
    batch = messages(bytes(raw))[1]
    struct.pack_into("<I", raw, batch.at + 8, 0xFFFFFFF0)  # the root table's offset
    path.write_bytes(bytes(raw))
    assert f"{path}: no Arrow IPC message at byte {batch.at} (a flatbuffer offset" in \
        _plan_error(path)


def test_negative_string_offsets_are_a_data_error_naming_the_batch(tmp_path: Path) -> None:
    # pyarrow turned them into a raw SystemError
    path = tmp_path / "data.arrow"
    good = pa.array(GOOD[:3], pa.string())
    offsets = np.frombuffer(good.buffers()[1], np.int32).copy()
    offsets[2] = -40
    bad = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets.tobytes()),
                                                 good.buffers()[2]])  # not validated
    with pa.ipc.new_stream(str(path), pa.schema([("text", pa.string())])) as w:
        w.write_batch(pa.record_batch([pa.array(GOOD[3:], pa.string())], names=["text"]))
        w.write_batch(pa.record_batch([bad], names=["text"]))
    second = messages(path.read_bytes())[2].at
    with pytest.raises(DataError) as info:
        bounded(lambda: drain(one_lane([str(path)])), 60)
    assert f"{path}: record batch 1 (at byte {second}) cannot be read" in str(info.value)


def test_a_value_over_the_record_bound_is_a_counted_record(tmp_path: Path) -> None:
    path = tmp_path / "data.arrow"
    big = "x" * (MAX_RECORD_BYTES + 1)
    _stream(path, [[GOOD[0], big, GOOD[1]]])
    del big
    tokens, counters = bounded(lambda: drain(one_lane([str(path)])), 60)
    np.testing.assert_array_equal(tokens, expected(GOOD[:2]))
    assert counters.skipped == {"too_large": 1}
    message = fail_message([str(path)])
    assert f"{path} at row 1" in message
    assert f"a value of {MAX_RECORD_BYTES + 1:,} bytes, over the limit of " \
           f"{MAX_RECORD_BYTES:,} bytes per record" in message


def _save_to_disk(root: Path, names: list[str]) -> Path:
    root.mkdir()
    state = root / "state.json"
    state.write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    return state


@pytest.mark.parametrize("name", ["../outside.arrow", "ABSOLUTE", "a//b.arrow"])
def test_a_data_file_outside_the_directory_is_refused(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside.arrow"
    _stream(outside, [["a secret document outside the dataset"]])
    if name == "ABSOLUTE":
        name = str(outside)
    state = _save_to_disk(tmp_path / "ds", [name])
    with pytest.raises(ConfigError) as info:
        bounded(lambda: Plan.build(one_lane([str(tmp_path / "ds")], format="hf")), 20)
    assert f"{state}: data file 0 is {name!r}, which is no path inside the dataset " \
           f"directory" in str(info.value)


def test_a_state_json_nested_past_the_parsers_limit_is_a_config_error(tmp_path: Path) -> None:
    state = _save_to_disk(tmp_path / "ds", [])
    state.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match=rf"{state} is not a save_to_disk state: its JSON is "
                                          rf"nested deeper than the parser's limit"):
        bounded(lambda: Plan.build(one_lane([str(tmp_path / "ds")], format="hf")), 20)


# found by tests/engine/formats/fuzz/test_fuzz_hf.py: each dropped batches silently, or raised
# pyarrow's own


def test_an_end_marker_before_the_last_batch_is_a_data_error(tmp_path: Path) -> None:
    # a metadata length of 0 is the end-of-stream marker: the batches after it were dropped
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3], GOOD[3:]]))
    batch = messages(bytes(raw))[2]
    struct.pack_into("<i", raw, batch.at + 4, 0)
    path.write_bytes(bytes(raw))
    assert f"{path}: the Arrow stream's end-of-stream marker ends at byte {batch.at + 8}, but " \
           f"the file has {len(raw)} bytes" in _plan_error(path)


def test_a_message_of_another_type_is_a_data_error(tmp_path: Path) -> None:
    # a batch whose header type reads 4 (a tensor) was skipped with its rows
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3], GOOD[3:]]))
    batch = messages(bytes(raw))[1]
    meta = bytes(raw[batch.at + 8:batch.at + 8 + batch.length])
    from datalane.engine.formats.hf import _field

    root = struct.unpack_from("<I", meta, 0)[0]
    kind_at = _field(meta, root, 1)
    assert kind_at is not None and raw[batch.at + 8 + kind_at] == 3
    raw[batch.at + 8 + kind_at] = 4
    path.write_bytes(bytes(raw))
    assert f"{path}: the Arrow message at byte {batch.at} has the type 4, where a stream " \
           f"holds batches" in _plan_error(path)


def test_a_schema_pyarrow_cannot_read_is_a_data_error_when_the_plan_is(tmp_path: Path) -> None:
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3]]))
    raw[18] ^= 1  # inside the schema's flatbuffer: pyarrow's OSError 'Invalid flatbuffers'
    path.write_bytes(bytes(raw))
    assert f"{path}: the Arrow schema message cannot be read" in _plan_error(path)


def test_a_field_name_that_is_not_utf8_is_a_data_error_when_the_plan_is(tmp_path: Path) -> None:
    """A schema pyarrow reads whose field name is not UTF-8: ``Schema.names`` raises a bare
    UnicodeDecodeError on first use, so the reader checks the names where it reads the schema
    (the fuzzer found it: a name byte set to 0x80)."""
    path = tmp_path / "data.arrow"
    raw = bytearray(_stream(path, [GOOD[:3]]))
    at = raw.index(b"text")
    raw[at] = 0x80
    path.write_bytes(bytes(raw))
    got = _plan_error(path)
    assert f"{path}: the Arrow schema message cannot be read" in got
    assert "UnicodeDecodeError" in got

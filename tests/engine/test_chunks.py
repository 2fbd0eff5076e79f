"""Chunks and record readers: every record exactly once, in file order, restartable anywhere.

Files are real (plain JSONL, gzip, zstd, Parquet written by pyarrow); positions are byte
offsets of line starts (JSONL, in the decompressed stream) or row indices (Parquet).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import datalane.engine.files as files_mod
import datalane.engine.formats.jsonl as jsonl_mod
from datalane.engine.chunks import MISSING, Chunk, RecordReader, cut_file
from datalane.engine.files import SourceFile, compression_of, expand, format_of
from datalane.spec import DataError, StorageError


def source_file(path: Path | str, fmt: str | None = None) -> SourceFile:
    """The SourceFile the planner would make for ``path``."""
    [(uri, size, ident)] = expand(str(path), "test")
    return SourceFile(uri, size, ident, format_of(uri, fmt, "test"), compression_of(uri))


def expected_lines(data: bytes) -> list[tuple[int, bytes]]:
    """``(offset of the line start, line without its newline)`` of every non-blank line."""
    out = []
    pos = 0
    for line in data.split(b"\n"):
        if line.strip():
            out.append((pos, line))
        pos += len(line) + 1
    return out


def read_all(reader: RecordReader, chunks: list[Chunk]) -> list[tuple[int, Any]]:
    return [rec for chunk in chunks for rec in reader.records(chunk)]


# -- plain JSONL ----------------------------------------------------------------------------------

_line = st.one_of(
    st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"~")),  # any bytes but a newline
    st.sampled_from([b"", b"  ", b"\t", b"\r"]),  # blank lines
    st.builds(lambda n: json.dumps({"text": "x" * n}).encode(), st.integers(0, 120)),
)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, max_size=20), final_newline=st.booleans(), data=st.data())
def test_plain_jsonl_chunks_yield_every_record_once_in_order(
        tmp_path: Path, lines: list[bytes], final_newline: bool, data: st.DataObject) -> None:
    content = b"\n".join(lines) + (b"\n" if final_newline and lines else b"")
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    sf = source_file(path)
    chunk_bytes = data.draw(st.integers(1, len(content) + 20), label="chunk_bytes")
    chunks = cut_file(3, sf, chunk_bytes, None)

    # chunks tile the file in order
    assert [c.file for c in chunks] == [3] * len(chunks)
    assert [(c.start, c.stop) for c in chunks] == [
        (s, min(s + chunk_bytes, len(content))) for s in range(0, len(content), chunk_bytes)]

    reader = RecordReader([sf, sf, sf, sf], "text")  # file index 3 is ours
    got = read_all(reader, chunks)
    want = expected_lines(content)
    assert got == want
    # a record belongs to the chunk its first byte lies in
    for chunk in chunks:
        for pos, _ in reader.records(chunk):
            assert chunk.start <= pos < chunk.stop
    # restarting a chunk at any record position yields the same tail
    for chunk in chunks:
        recs = list(reader.records(chunk))
        for i, (pos, _) in enumerate(recs):
            assert list(reader.records(chunk, pos)) == recs[i:]
    for pos, line in want:
        assert reader.read_one((3, pos)) == line


def test_plain_jsonl_example_with_crlf_blank_lines_and_no_final_newline(tmp_path: Path) -> None:
    content = b'{"text": "a"}\r\n\n   \n{"text": "bb"}\n\n{"text": "ccc"}'
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    sf = source_file(path)
    for chunk_bytes in (1, 5, 16, 17, 18, 1 << 20):
        got = read_all(RecordReader([sf], "text"), cut_file(0, sf, chunk_bytes, None))
        assert got == [(0, b'{"text": "a"}\r'), (20, b'{"text": "bb"}'),
                       (36, b'{"text": "ccc"}')], chunk_bytes


def test_a_chunk_inside_one_long_record_is_empty(tmp_path: Path) -> None:
    long = json.dumps({"text": "y" * 100}).encode()
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"{}\n" + long + b"\n{}\n")
    sf = source_file(path)
    chunks = cut_file(0, sf, 10, None)
    reader = RecordReader([sf], "text")
    per_chunk = [list(reader.records(c)) for c in chunks]
    assert per_chunk[0] == [(0, b"{}"), (3, long)]
    assert all(recs == [] for recs in per_chunk[1:-2])
    assert [r for recs in per_chunk for r in recs] == [(0, b"{}"), (3, long),
                                                      (4 + len(long), b"{}")]


def test_empty_jsonl_file_has_no_chunks(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert cut_file(0, source_file(path), 100, None) == []


def test_reading_a_chunk_reads_about_the_chunk_not_the_rest_of_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each chunk must stop reading at the first newline past its range. (It used to read on
    # until a 64 KiB read happened to end exactly on a newline: nearly the whole file for
    # every chunk.)
    line = json.dumps({"text": "z" * 190}).encode() + b"\n"  # 203 bytes, coprime to 64 KiB
    content = line * 5000  # about 1 MB
    path = tmp_path / "big.jsonl"
    path.write_bytes(content)
    sf = source_file(path)
    read = [0]
    real_open = files_mod.open_file

    class Counting(io.RawIOBase):
        def __init__(self, f: Any) -> None:
            self._f = f

        def readable(self) -> bool:
            return True

        def seek(self, pos: int, whence: int = 0) -> int:
            return int(self._f.seek(pos, whence))

        def read(self, n: int = -1) -> bytes:
            got: bytes = self._f.read(n)
            read[0] += len(got)
            return got

        def close(self) -> None:
            self._f.close()
            super().close()

    monkeypatch.setattr("datalane.engine.formats.jsonl.open_file",
                        lambda uri, **kw: Counting(real_open(uri, **kw)))
    chunk_bytes = 16384
    chunks = cut_file(0, sf, chunk_bytes, None)
    got = read_all(RecordReader([sf], "text"), chunks)
    assert len(got) == 5000
    assert got[-1] == (len(content) - len(line), line[:-1])
    # (a line of 203 bytes ends within the first 4 KiB read past a chunk)
    assert read[0] <= len(content) + len(chunks) * (jsonl_mod._READ_FIRST + len(line))


# -- compressed JSONL -----------------------------------------------------------------------------


def _compressed(tmp_path: Path, kind: str, content: bytes) -> Path:
    if kind == "gz":
        path = tmp_path / "data.jsonl.gz"
        path.write_bytes(gzip.compress(content))
    else:
        path = tmp_path / "data.jsonl.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(content))
    return path


def _content(n: int) -> bytes:
    lines = [json.dumps({"text": f"document {i} " + "w" * (i * 7 % 50)}).encode()
             for i in range(n)]
    lines[5:5] = [b"", b"  "]
    return b"\n".join(lines)  # no final newline


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_compressed_jsonl_is_one_chunk_read_fully(tmp_path: Path, kind: str) -> None:
    content = _content(300)
    sf = source_file(_compressed(tmp_path, kind, content))
    assert sf.compression == {"gz": "gzip", "zst": "zstd"}[kind]
    assert sf.format == "jsonl"
    chunks = cut_file(0, sf, 7, None)  # chunk_bytes does not apply to compressed files
    assert chunks == [Chunk(0, 0, -1)]
    reader = RecordReader([sf], "text")
    recs = list(reader.records(chunks[0]))
    assert recs == expected_lines(content)
    assert len(recs) == 300


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_compressed_jsonl_restarts_from_a_middle_position(tmp_path: Path, kind: str) -> None:
    content = _content(120)
    sf = source_file(_compressed(tmp_path, kind, content))
    reader = RecordReader([sf], "text")
    [chunk] = cut_file(0, sf, 1 << 20, None)
    recs = list(reader.records(chunk))
    for i in (1, 4, 5, 60, len(recs) - 1):
        assert list(reader.records(chunk, recs[i][0])) == recs[i:]


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_compressed_read_one_rereads_any_record(tmp_path: Path, kind: str) -> None:
    # read_one restores a packer's carry-over; the zstd reader has no readline of its own.
    content = _content(40)
    sf = source_file(_compressed(tmp_path, kind, content))
    reader = RecordReader([sf], "text")
    for pos, line in reversed(expected_lines(content)):
        assert reader.read_one((0, pos)) == line


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_compressed_file_of_nothing_yields_no_record(tmp_path: Path, kind: str) -> None:
    sf = source_file(_compressed(tmp_path, kind, b""))
    chunks = cut_file(0, sf, 100, None)
    assert len(chunks) == 1  # the compressed file has bytes (a header)
    assert list(RecordReader([sf], "text").records(chunks[0])) == []


def test_truncated_gzip_is_a_data_error_naming_the_file(tmp_path: Path) -> None:
    """Corruption is not transient: retrying cannot help, so it is a DataError."""
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(_content(200))[:-40])
    sf = source_file(path)
    reader = RecordReader([sf], "text")
    with pytest.raises(DataError) as info:
        list(reader.records(Chunk(0, 0, -1)))
    assert str(info.value).startswith(
        f"{sf.uri}: the compressed stream is corrupt or truncated: ")


# -- Parquet --------------------------------------------------------------------------------------


TEXTS = [f"row {i} " + "é" * (i % 4) for i in range(30)]
TEXTS[4] = ""
TEXTS_WITH_NULL: list[str | None] = list(TEXTS)
TEXTS_WITH_NULL[11] = None


def _parquet(tmp_path: Path, name: str = "data.parquet", rows: int = 30,
             row_group_size: int = 7, column: str = "text") -> Path:
    path = tmp_path / name
    table = pa.table({"id": list(range(rows)), column: TEXTS_WITH_NULL[:rows]})
    pq.write_table(table, path, row_group_size=row_group_size)
    assert pq.ParquetFile(path).metadata.num_row_groups == -(-rows // row_group_size)
    return path


def test_parquet_row_groups_are_the_chunks(tmp_path: Path) -> None:
    sf = source_file(_parquet(tmp_path))
    assert sf.format == "parquet"
    chunks = cut_file(2, sf, 1, None)
    assert chunks == [Chunk(2, 0, 7), Chunk(2, 7, 14), Chunk(2, 14, 21), Chunk(2, 21, 28),
                      Chunk(2, 28, 30)]


def test_parquet_chunk_rows_cut_inside_row_groups(tmp_path: Path) -> None:
    sf = source_file(_parquet(tmp_path))
    chunks = cut_file(0, sf, 1, 3)
    assert [(c.start, c.stop) for c in chunks] == [
        (0, 3), (3, 6), (6, 7), (7, 10), (10, 13), (13, 14), (14, 17), (17, 20), (20, 21),
        (21, 24), (24, 27), (27, 28), (28, 30)]
    assert [(c.start, c.stop) for c in cut_file(0, sf, 1, 100)] == [
        (0, 7), (7, 14), (14, 21), (21, 28), (28, 30)]


@pytest.mark.parametrize("chunk_rows", [None, 1, 3, 5, 7, 100])
def test_parquet_records_read_back_exactly(tmp_path: Path, chunk_rows: int | None) -> None:
    sf = source_file(_parquet(tmp_path))
    reader = RecordReader([sf], "text")
    chunks = cut_file(0, sf, 1, chunk_rows)
    assert read_all(reader, chunks) == list(enumerate(TEXTS_WITH_NULL))
    for chunk in chunks:  # restart at every row
        recs = list(reader.records(chunk))
        for i, (row, _) in enumerate(recs):
            assert list(reader.records(chunk, row)) == recs[i:]


def test_parquet_read_one_any_row_in_any_order(tmp_path: Path) -> None:
    files = [source_file(_parquet(tmp_path, "a.parquet")),
             source_file(_parquet(tmp_path, "b.parquet", rows=10, row_group_size=4))]
    reader = RecordReader(files, "text")
    for row in (29, 0, 13, 7, 6, 28, 11):
        assert reader.read_one((0, row)) == TEXTS_WITH_NULL[row]
    for row in (9, 0, 5, 3, 4):
        assert reader.read_one((1, row)) == TEXTS_WITH_NULL[row]
    assert reader.read_one((0, 4)) == ""
    with pytest.raises(StorageError) as info:
        reader.read_one((1, 10))
    assert str(info.value) == f"{files[1].uri} has no row 10"


def test_parquet_without_the_text_column_yields_missing(tmp_path: Path) -> None:
    sf = source_file(_parquet(tmp_path, column="body"))
    reader = RecordReader([sf], "text")
    recs = read_all(reader, cut_file(0, sf, 1, 4))
    assert [row for row, _ in recs] == list(range(30))
    assert all(value is MISSING for _, value in recs)
    assert reader.read_one((0, 17)) is MISSING
    # the same file read with the right field has the values
    assert read_all(RecordReader([sf], "body"), cut_file(0, sf, 1, None))[3] == (3, TEXTS[3])


def test_parquet_binary_and_integer_columns_are_returned_raw(tmp_path: Path) -> None:
    path = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff\xfe", None], pa.binary()),
                             "n": [1, 2, 3]}), path)
    sf = source_file(path)
    assert read_all(RecordReader([sf], "text"), cut_file(0, sf, 1, None)) == [
        (0, b"ok"), (1, b"\xff\xfe"), (2, None)]
    assert read_all(RecordReader([sf], "n"), cut_file(0, sf, 1, None)) == [
        (0, 1), (1, 2), (2, 3)]


def test_empty_parquet_file_has_no_chunks(tmp_path: Path) -> None:
    # pyarrow writes an empty table as one row group of 0 rows; that is no chunk (it used to
    # crash with "range() arg 3 must not be zero").
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    sf = source_file(path)
    assert cut_file(0, sf, 1, None) == []
    assert cut_file(0, sf, 1, 5) == []


def test_parquet_with_an_empty_row_group_between_others(tmp_path: Path) -> None:
    path = tmp_path / "gap.parquet"
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        writer.write_table(pa.table({"text": ["a", "b"]}, schema=schema))
        writer.write_table(pa.table({"text": pa.array([], pa.string())}, schema=schema))
        writer.write_table(pa.table({"text": ["c"]}, schema=schema))
    sf = source_file(path)
    chunks = cut_file(0, sf, 1, None)
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 3)]
    assert read_all(RecordReader([sf], "text"), chunks) == [(0, "a"), (1, "b"), (2, "c")]


def test_not_a_parquet_file_is_a_data_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"this is not parquet at all")
    sf = source_file(path)
    with pytest.raises(DataError) as info:
        cut_file(0, sf, 1, None)
    assert str(info.value).startswith(f"{sf.uri} is not a readable Parquet file: ")


# -- several files --------------------------------------------------------------------------------


def test_records_of_several_files_keep_their_file_index(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_bytes(b'{"text": "a0"}\n{"text": "a1"}\n')
    b = _compressed(tmp_path, "gz", b'{"text": "b0"}\n')
    c = _parquet(tmp_path, "c.parquet", rows=3, row_group_size=2)
    files = [source_file(a), source_file(b), source_file(c)]
    chunks = [ch for i, sf in enumerate(files) for ch in cut_file(i, sf, 1 << 20, None)]
    assert [ch.file for ch in chunks] == [0, 1, 2, 2]
    reader = RecordReader(files, "text")
    assert read_all(reader, chunks) == [
        (0, b'{"text": "a0"}'), (15, b'{"text": "a1"}'), (0, b'{"text": "b0"}'),
        (0, TEXTS[0]), (1, TEXTS[1]), (2, TEXTS[2])]
    assert reader.read_one((0, 15)) == b'{"text": "a1"}'
    assert reader.read_one((1, 0)) == b'{"text": "b0"}'
    assert reader.read_one((2, 2)) == TEXTS[2]
    reader.close()
    assert reader.read_one((2, 1)) == TEXTS[1]  # reopens after close


def iter_positions(reader: RecordReader, chunks: list[Chunk]) -> Iterator[int]:
    for chunk in chunks:
        for pos, _ in reader.records(chunk):
            yield pos


def test_file_uri_scheme_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"text": "x"}\n{"text": "y"}\n')
    [(uri, size, _)] = expand("file://" + os.fspath(path), "test")
    assert size == path.stat().st_size
    sf = SourceFile(uri, size, "x", "jsonl", None)
    reader = RecordReader([sf], "text")
    assert list(iter_positions(reader, cut_file(0, sf, 5, None))) == [0, 14]

"""Chunks and record readers (DESIGN section 3.1).

A source file is cut into chunks: Parquet row groups (or row ranges of ``chunk_rows`` inside
them), plain JSONL byte ranges of ``chunk_bytes`` aligned to newlines (a record belongs to the
chunk its first byte lies in), and compressed JSONL files whole, since gzip and zstd streams
cannot be entered in the middle. The last, shorter chunk of a file is read like any other.

A record's *position* is its byte offset (JSONL, in the decompressed stream) or its row index
(Parquet) within its file, so a document can be re-read directly from ``(file, position)``.
Callers: :mod:`datalane.engine.plan` (cutting) and :mod:`datalane.engine.docstream` (reading).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from datalane.engine.files import SourceFile, open_file
from datalane.spec.errors import DataError, StorageError

__all__ = ["MISSING", "Chunk", "RecordReader", "cut_file"]

MISSING = object()  # a Parquet source without the text column
_READ_MORE = 1 << 16


@dataclass(frozen=True)
class Chunk:
    """A piece of one file: byte range ``[start, stop)`` (JSONL; stop -1 is "to the end") or
    row range ``[start, stop)`` (Parquet)."""

    file: int
    start: int
    stop: int


def _parquet_row_groups(sf: SourceFile) -> list[int]:
    import pyarrow.parquet as pq

    with open_file(sf.uri) as f:
        try:
            meta = pq.ParquetFile(f).metadata
        except Exception as e:  # pyarrow raises ArrowInvalid and OSError subclasses
            raise StorageError(f"{sf.uri} is not a readable Parquet file: {e}") from e
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def cut_file(index: int, sf: SourceFile, chunk_bytes: int, chunk_rows: int | None) -> list[Chunk]:
    """The chunks of one file, in file order."""
    if sf.format == "parquet":
        chunks: list[Chunk] = []
        row = 0
        for rows in _parquet_row_groups(sf):
            if rows == 0:  # an empty row group (an empty table is written as one)
                continue
            step = chunk_rows or rows
            chunks.extend(Chunk(index, s, min(s + step, row + rows))
                          for s in range(row, row + rows, step))
            row += rows
        return chunks
    if sf.compression is not None:
        return [Chunk(index, 0, -1)] if sf.size > 0 else []
    return [Chunk(index, s, min(s + chunk_bytes, sf.size)) for s in range(0, sf.size, chunk_bytes)]


class RecordReader:
    """Reads raw records of one source's files; keeps one open Parquet file and row group."""

    def __init__(self, files: list[SourceFile], text_field: str) -> None:
        self._files = files
        self._field = text_field
        self._parquet: OrderedDict[int, Any] = OrderedDict()
        self._group: tuple[int, int, list[Any]] | None = None  # (file, first row, values)

    # -- Parquet -----------------------------------------------------------------------------
    def _parquet_file(self, index: int) -> Any:
        import pyarrow.parquet as pq

        pf = self._parquet.get(index)
        if pf is None:
            pf = pq.ParquetFile(open_file(self._files[index].uri))
            self._parquet[index] = pf
            while len(self._parquet) > 2:
                self._parquet.popitem(last=False)
        else:
            self._parquet.move_to_end(index)
        return pf

    def _row_group_of(self, index: int, row: int) -> tuple[int, list[Any]]:
        if self._group and self._group[0] == index and \
                self._group[1] <= row < self._group[1] + len(self._group[2]):
            return self._group[1], self._group[2]
        pf = self._parquet_file(index)
        meta = pf.metadata
        first = 0
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            if row < first + rows:
                break
            first += rows
        else:
            raise StorageError(f"{self._files[index].uri} has no row {row}")
        try:
            if self._field in pf.schema_arrow.names:
                values = pf.read_row_group(g, columns=[self._field]).column(0).to_pylist()
            else:
                values = [MISSING] * rows
        except OSError as e:
            raise StorageError(f"cannot read row group {g} of {self._files[index].uri}: {e}",
                               transient=True) from e
        self._group = (index, first, values)
        return first, values

    def _parquet_records(self, chunk: Chunk, start: int) -> Iterator[tuple[int, Any]]:
        row = start
        while row < chunk.stop:
            first, values = self._row_group_of(chunk.file, row)
            end = min(chunk.stop, first + len(values))
            for r in range(row, end):
                yield r, values[r - first]
            row = end

    # -- JSONL -------------------------------------------------------------------------------
    def _jsonl_plain(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, bytes]]:
        uri = self._files[chunk.file].uri
        try:
            with open_file(uri) as f:
                if start is not None:  # a known record boundary
                    base = start
                    f.seek(base)
                    buf = f.read(max(chunk.stop - base, 0))
                    first = 0
                elif chunk.start == 0:
                    base, first = 0, 0
                    buf = f.read(chunk.stop)
                else:  # a record starts after the first newline at or after start - 1
                    base = chunk.start - 1
                    f.seek(base)
                    buf = f.read(chunk.stop - base)
                    nl = buf.find(b"\n")
                    first = len(buf) if nl < 0 else nl + 1
                if first >= len(buf) and base + len(buf) >= chunk.stop:
                    return
                # finish the last record that starts in the range: read on until a newline
                # at or after the range's last byte (not until a read happens to end on one)
                scan = max(chunk.stop - base - 1, 0)
                while buf.find(b"\n", scan) < 0:
                    more = f.read(_READ_MORE)
                    if not more:
                        break
                    scan = len(buf)
                    buf += more
        except OSError as e:
            raise StorageError(f"cannot read {uri} bytes {chunk.start}-{chunk.stop}: {e}",
                               transient=True) from e
        pos = first
        n = len(buf)
        while pos < n and base + pos < chunk.stop:
            end = buf.find(b"\n", pos)
            if end < 0:
                end = n
            line = buf[pos:end]
            if line.strip():
                yield base + pos, line
            pos = end + 1

    def _jsonl_stream(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, bytes]]:
        sf = self._files[chunk.file]
        try:
            with open_file(sf.uri, sf.compression) as raw:
                f = _buffered(raw)
                pos = start or 0
                if pos:
                    _skip(f, pos)
                for line in f:
                    length = len(line)
                    body = line.rstrip(b"\n")
                    if body.strip():
                        yield pos, body
                    pos += length
        except Exception as e:
            _raise_read_error(e, sf.uri)

    # -- public ------------------------------------------------------------------------------
    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(position, raw)`` of each record of ``chunk``, from ``start`` if given."""
        sf = self._files[chunk.file]
        if sf.format == "parquet":
            return self._parquet_records(chunk, chunk.start if start is None else start)
        if sf.compression is None:
            return self._jsonl_plain(chunk, start)
        return self._jsonl_stream(chunk, start)

    def read_one(self, file: int, pos: int) -> Any:
        """The raw record at ``pos`` of file ``file`` (for re-reading carried documents)."""
        sf = self._files[file]
        if sf.format == "parquet":
            first, values = self._row_group_of(file, pos)
            return values[pos - first]
        try:
            with open_file(sf.uri, sf.compression) as raw:
                f = _buffered(raw)  # zstd readers have no readline
                _skip(f, pos)
                return f.readline().rstrip(b"\n")
        except Exception as e:
            _raise_read_error(e, f"{sf.uri} at byte {pos}")

    def close(self) -> None:
        self._parquet.clear()
        self._group = None


def _buffered(raw: Any) -> Any:
    """A line-iterable reader over ``raw`` (decompressing readers may lack readline)."""
    return raw if hasattr(raw, "peek") else io.BufferedReader(raw)


def _raise_read_error(e: Exception, what: str) -> NoReturn:
    """Re-raise a failure while reading a (possibly compressed) stream, classified."""
    import gzip
    import zlib

    corrupt: tuple[type[BaseException], ...] = (EOFError, gzip.BadGzipFile, zlib.error)
    try:
        import zstandard

        corrupt += (zstandard.ZstdError,)
    except ImportError:
        pass
    if isinstance(e, corrupt):
        raise DataError(f"{what}: the compressed stream is corrupt or truncated: {e}") from e
    if isinstance(e, FileNotFoundError):
        raise StorageError(f"{what}: the file disappeared after planning") from e
    if isinstance(e, OSError) and not isinstance(e, StorageError):
        raise StorageError(f"cannot read {what}: {e}", transient=True) from e
    raise e


def _skip(f: Any, pos: int) -> None:
    try:
        f.seek(pos)
    except (OSError, ValueError, io.UnsupportedOperation):
        left = pos
        while left:
            got = f.read(min(left, 1 << 20))
            if not got:
                break
            left -= len(got)

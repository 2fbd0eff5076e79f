"""JSON Lines: one JSON object per line, plain or gzip/zstd compressed.

Plain files are cut into byte ranges of ``chunk_bytes`` aligned to newlines (a record belongs
to the chunk its first byte lies in); compressed files are one chunk each, since gzip and
zstd streams cannot be entered in the middle. A record's position is its byte offset in the
(decompressed) stream; its value is the field of the parsed object, decoded on worker
threads.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any, NoReturn

from datalane.engine.files import SourceFile, open_file
from datalane.engine.formats.base import Chunk, Decoded
from datalane.spec.errors import DataError, StorageError

__all__ = ["JSONL"]

_READ_MORE = 1 << 16


class JsonlReader:
    """Lines of one source's JSONL files (blank lines are not records)."""

    def __init__(self, files: list[SourceFile], field: str) -> None:
        self._files = files

    def _plain(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, bytes]]:
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

    def _stream(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, bytes]]:
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

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, bytes]]:
        if self._files[chunk.file].compression is None:
            return self._plain(chunk, start)
        return self._stream(chunk, start)

    def read_one(self, file: int, pos: int) -> bytes:
        sf = self._files[file]
        try:
            with open_file(sf.uri, sf.compression) as raw:
                f = _buffered(raw)  # zstd readers have no readline
                _skip(f, pos)
                line: bytes = f.readline()
                return line.rstrip(b"\n")
        except Exception as e:
            _raise_read_error(e, f"{sf.uri} at byte {pos}")

    def fields(self, file: int) -> list[str]:
        """The keys of the first record of the file that parses as a JSON object."""
        chunk = Chunk(file, 0, -1) if self._files[file].compression else Chunk(
            file, 0, self._files[file].size)
        for seen, (_, line) in enumerate(self.records(chunk)):
            if seen >= 100:
                break
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                return [str(k) for k in obj]
        return []

    def close(self) -> None:
        pass


class Jsonl:
    name = "jsonl"
    unit = "byte"
    bad_reasons = frozenset({"malformed_json", "non_utf8", "missing_field"})

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        if sf.compression is not None:
            return [Chunk(index, 0, -1)] if sf.size > 0 else []
        return [Chunk(index, s, min(s + chunk_bytes, sf.size))
                for s in range(0, sf.size, chunk_bytes)]

    def reader(self, files: list[SourceFile], field: str) -> JsonlReader:
        return JsonlReader(files, field)

    def decode(self, raw: Any, field: str) -> Decoded:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, "non_utf8", f"invalid UTF-8 at byte {e.start} of the line"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            return None, "malformed_json", f"malformed JSON ({e.msg}: column {e.colno})"
        except RecursionError:
            return None, "malformed_json", "JSON nested deeper than the parser's limit"
        except ValueError as e:  # an integer beyond Python's digit limit, and the like
            return None, "malformed_json", f"JSON the parser refuses: {e}"
        if not isinstance(obj, dict):
            return None, "malformed_json", f"a JSON {type(obj).__name__}, not an object"
        if field not in obj or obj[field] is None:
            return None, "missing_field", f"no field {field!r}"
        return obj[field], None, None

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        if all(f.compression is not None for f in files if f.format == self.name):
            return "compressed files are one chunk each: split them into more files"
        return f"set a smaller {where}.chunk_bytes, add files"


JSONL = Jsonl()


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

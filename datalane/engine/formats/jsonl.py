"""JSON Lines: one JSON object per line, plain or gzip/zstd compressed.

Plain files are cut into byte ranges of ``chunk_bytes`` aligned to newlines: a record belongs
to the chunk its first byte lies in. A record's position is the byte offset of its first byte;
its value is the field of the parsed object, decoded on worker threads.

Compressed files are cut at frame boundaries (zstd frames, gzip members; see
:mod:`datalane.engine.compressed` for how they are found), since a stream can be
entered only where a frame starts. Consecutive frames are grouped: a chunk ends at the first
frame that starts at or after the next multiple of ``chunk_bytes`` of *compressed* data, so
many small frames share a chunk and a frame larger than ``chunk_bytes`` is a chunk of its
own. A file of one frame - most files ``gzip`` and ``zstd`` write - is one chunk
``(0, -1)``, as a file no larger than ``chunk_bytes`` is (its frames are not even looked for).

In a compressed file a chunk's range and a record's position are in bytes of the
*decompressed* stream (the whole file's, not one frame's): a position is the offset of the
record's first byte in the concatenation of all the frames' contents. So a position means the
same whatever the chunking, a single-frame file's positions are what they always were, and
errors name a byte a user can find with ``zstd -dc | head -c``. The file's frame index maps a
position to the frame holding it (its compressed and decompressed offsets), so
``records(chunk, start=pos)`` and ``read_one((file, pos))`` decompress from that frame's start
only - at most one frame before the record, never the file from its start.

Records may span a frame boundary: the stream is continuous, and a chunk ends where plain
JSONL's do, by reading on to the end of the last record it owns. The one difference from
plain files is which chunk owns a record that starts exactly on a chunk boundary: the chunk
*before* it. A chunk ``[s, e)`` (decompressed offsets, both frame starts) owns the records
whose preceding newline lies in ``[s, e)`` (the first chunk also owns the record at 0): it
starts reading at its own first frame and skips to the first newline at or after ``s``, never
needing byte ``s - 1``, which lies in the previous frame and would mean decompressing all of
that frame. Writers often end each frame on a line end, so under the other rule every chunk
would decompress a whole frame of its neighbour; under this one the previous chunk reads the
next frame only up to its first newline.
"""

from __future__ import annotations

import importlib
import io
import itertools
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from datalane.engine.compressed import (
    FrameIndex,
    frame_index,
    frames_begun,
    known_index,
    open_stream,
)
from datalane.engine.files import SourceFile, open_file
from datalane.engine.formats.base import Chunk, Decoded, FormatBase, Ref, TooLarge
from datalane.spec.errors import DataError, StorageError
from datalane.spec.limits import MAX_RECORD_BYTES

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["JSONL", "JsonlReader", "parse_object"]

# the last record of a chunk is finished by reads of 4 KiB, doubling up to 64 KiB: a line
# usually ends within the first (a remote file fetches what is read, no read-ahead)
_READ_FIRST = 1 << 12
_READ_MORE = 1 << 16
_SCAN = 1 << 20  # read at a time past a line over the bound, to its end (nothing is kept)

Raw = bytes | TooLarge  # a line, or one over MAX_RECORD_BYTES that was not kept


class JsonlReader:
    """Lines of one source's JSONL files (blank lines are not records)."""

    def __init__(self, files: list[SourceFile], field: str) -> None:
        self._files = files

    def _plain(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, Raw]]:
        sf = self._files[chunk.file]
        tail: Raw | None = None
        n = 0
        try:
            with open_file(sf, ranged=True) as f:
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
                # the last record that starts in the range runs on past it unless a newline
                # ends it there: finish it (bounded, see _finish)
                n = len(buf)
                cut = max(first, buf.rfind(b"\n") + 1)
                if cut < n and base + cut < chunk.stop:
                    tail = _finish(f, memoryview(buf)[cut:])
                    n = cut
        except OSError as e:
            raise StorageError(f"cannot read {sf.uri} bytes {chunk.start}-{chunk.stop}: {e}",
                               transient=True) from e
        pos = first
        while pos < n and base + pos < chunk.stop:
            end = buf.find(b"\n", pos)
            if end < 0:
                end = n
            if end - pos > MAX_RECORD_BYTES:  # only with chunk_bytes over the bound
                yield base + pos, TooLarge(end - pos, "line")
            else:
                line = buf[pos:end]
                if line.strip():
                    yield base + pos, line
            pos = end + 1
        if tail is not None and (not isinstance(tail, bytes) or tail.strip()):
            yield base + n, tail

    def _compressed(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, Raw]]:
        sf = self._files[chunk.file]
        assert sf.compression is not None
        whole = chunk.start == 0 and chunk.stop < 0
        begin = chunk.start if start is None else start
        index: FrameIndex | None = None
        if not whole:
            index = frame_index(sf)
        elif begin > 0:
            index = known_index(sf)  # a shortcut when this process has it
        coffset, doffset = index.restart(begin) if index is not None else (0, 0)
        stop = chunk.stop
        try:
            with open_stream(sf, sf.compression, coffset) as f:
                pos = doffset + _skip_stream(f, begin - doffset)
                if pos < begin:
                    if whole:
                        return
                    raise _ended_early(sf.uri, pos, chunk)
                if start is None and begin > 0:  # a record starting before the chunk's
                    pos += _line(f)[0]           # first newline is the previous chunk's
                while True:
                    used, body = _line(f)
                    if not used or 0 <= stop < pos:
                        break
                    if not isinstance(body, bytes) or body.strip():
                        yield pos, body
                    pos += used
                if not used and pos < stop:
                    raise _ended_early(sf.uri, pos, chunk)
                # read past its end: a frame must start there (a seek table's or a header's
                # size too small would otherwise lose the records up to the real frame end)
                if used and stop >= 0 and all(d != stop - doffset for _, d in frames_begun(f)):
                    raise _no_frame_at_end(sf.uri, chunk)
        except DataError:
            raise
        except Exception as e:
            _raise_read_error(e, sf.uri)

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Raw]]:
        if self._files[chunk.file].compression is None:
            return self._plain(chunk, start)
        return self._compressed(chunk, start)

    def read_one(self, ref: Ref) -> Raw:
        file, pos = ref
        sf = self._files[file]
        try:
            if sf.compression is None:
                with open_file(sf) as raw:
                    f = _buffered(raw)
                    _skip(f, pos)
                    return _line(f)[1]
            index = known_index(sf)
            coffset, doffset = index.restart(pos) if index is not None else (0, 0)
            with open_stream(sf, sf.compression, coffset) as f:
                _skip_stream(f, pos - doffset)
                return _line(f)[1]
        except DataError:
            raise
        except Exception as e:
            _raise_read_error(e, f"{sf.uri} at byte {pos}")

    def fields(self, file: int) -> list[str]:
        """The keys of the first record of the file that parses as a JSON object."""
        chunk = Chunk(file, 0, -1) if self._files[file].compression else Chunk(
            file, 0, self._files[file].size)
        for seen, (_, line) in enumerate(self.records(chunk)):
            if seen >= 100:
                break
            if not isinstance(line, bytes):
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                return [str(k) for k in obj]
        return []

    def close(self) -> None:
        pass


class Jsonl(FormatBase):
    name = "jsonl"
    unit = "byte"
    bad_reasons = frozenset({"malformed_json", "non_utf8", "missing_field"})

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        if sf.compression is not None:
            if sf.size <= 0:
                return []
            if sf.size <= chunk_bytes:  # one chunk whatever its frames: do not look for them
                return [Chunk(index, 0, -1)]
            bounds = frame_index(sf).boundaries(chunk_bytes)
            if len(bounds) <= 2:
                return [Chunk(index, 0, -1)]
            return [Chunk(index, a, b) for a, b in itertools.pairwise(bounds)]
        return [Chunk(index, s, min(s + chunk_bytes, sf.size))
                for s in range(0, sf.size, chunk_bytes)]

    def reader(self, files: list[SourceFile], field: str) -> JsonlReader:
        return JsonlReader(files, field)

    def decode(self, raw: Any, field: str) -> Decoded:
        obj, reason, detail = parse_object(raw)
        if obj is None:
            return None, reason, detail
        if field not in obj or obj[field] is None:
            return None, "missing_field", f"no field {field!r}"
        return obj[field], None, None

    def for_source(self, source: Source) -> Jsonl:
        """The configured copy a kind names by its ``jsonl_format`` (``module:attribute``,
        built with the kind's configuration: llava's reads each record's images beside its
        file, :mod:`datalane.engine.formats.llavajson`); every other source reads lines as
        they are."""
        path = getattr(source.kind_config, "jsonl_format", None)
        if path is None:
            return self
        module, _, attribute = path.partition(":")
        made: Jsonl = getattr(importlib.import_module(module), attribute)(source.kind_config)
        return made

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        mine = [f for f in files if f.format == self.name]
        # a compressed file no larger than chunk_bytes was not indexed: index it now (this is
        # an error path, with fewer chunks than lanes, so few files)
        single = [f for f in mine if f.compression is not None and frame_index(f).frames <= 1]
        hints = []
        if len(single) < len(mine):
            hints.append(f"set a smaller {where}.chunk_bytes, add files")
        if single:
            hints.append("compressed files with one frame are one chunk each: write them with "
                         "several frames (pzstd, bgzip, the zstd seekable format) or split "
                         "them")
        return "; or ".join(hints)


JSONL = Jsonl()


def parse_object(raw: bytes) -> tuple[dict[str, Any] | None, str, str]:
    """The JSON object a record's bytes hold, or ``(None, reason, detail)`` for a bad record
    (``non_utf8``, ``malformed_json``: not JSON, or JSON that is no object)."""
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
    return obj, "", ""


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


def _finish(f: Any, head: memoryview) -> Raw:
    """The rest of a line whose first bytes are ``head``, read from ``f`` up to its newline
    (or the end of the file); a line over :data:`MAX_RECORD_BYTES` is read to its end without
    being kept. Pieces are joined once: appending each read to the line so far copied it
    again every time, which made a long line cost time quadratic in its length."""
    total = len(head)
    pieces: list[bytes | memoryview] | None = [head] if total <= MAX_RECORD_BYTES else None
    want = _READ_FIRST
    while True:
        more = f.read(want if pieces is not None else _SCAN)
        if not more:
            break
        nl = more.find(b"\n")
        piece = more if nl < 0 else more[:nl]
        total += len(piece)
        if pieces is not None:
            if total > MAX_RECORD_BYTES:
                pieces = None
            else:
                pieces.append(piece)
        if nl >= 0:
            break
        want = min(2 * want, _READ_MORE)
    return b"".join(pieces) if pieces is not None else TooLarge(total, "line")


def _line(f: Any) -> tuple[int, Raw]:
    """``(bytes consumed, the line without its newline)`` of the next line of buffered stream
    ``f`` - ``(0, b"")`` at its end; a line over :data:`MAX_RECORD_BYTES` is consumed to its
    end in bounded pieces and given as :class:`TooLarge`."""
    got = f.readline(MAX_RECORD_BYTES + 1)
    if got.endswith(b"\n"):
        return len(got), got[:-1]
    if len(got) <= MAX_RECORD_BYTES:  # the last line of the stream, or none
        return len(got), got
    used = len(got)
    while True:
        more = f.readline(_SCAN)
        used += len(more)
        if not more or more.endswith(b"\n"):
            return used, TooLarge(used - (1 if more.endswith(b"\n") else 0), "line")


def _skip_stream(f: Any, n: int) -> int:
    """Read and drop ``n`` bytes of a stream; how many there were."""
    left = n
    while left > 0:
        got = f.read(min(left, 1 << 20))
        if not got:
            break
        left -= len(got)
    return n - max(left, 0)


def _ended_early(uri: str, pos: int, chunk: Chunk) -> DataError:
    return DataError(
        f"{uri}: the compressed stream ends at decompressed byte {pos}, before the end of its "
        f"chunk (bytes {chunk.start}-{chunk.stop}) that the file's frame index promised when "
        f"the plan was made: the file was truncated or rewritten since")


def _no_frame_at_end(uri: str, chunk: Chunk) -> DataError:
    return DataError(
        f"{uri}: the file's frame index does not match its compressed stream: no frame starts "
        f"at decompressed byte {chunk.stop}, where the chunk (bytes {chunk.start}-{chunk.stop}) "
        f"ends - a seek table or frame header with a wrong size, or a file rewritten since the "
        f"plan was made")


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

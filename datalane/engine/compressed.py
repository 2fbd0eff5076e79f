"""Compressed files (gzip, zstd): strict streams, and the frames a file is made of.

**Reading.** :func:`open_stream` decompresses a file from the start of one of its frames
(zstd) or members (gzip) to its end, frame after frame as one stream: a file of several frames
reads as the concatenation of their contents, as ``zstd -d`` and ``gzip -d`` read it. It is
strict where fsspec's readers are not (python-zstandard's stream reader returns a shorter
stream, without any error, for a zstd file cut in the middle of a frame): a stream that ends
inside a frame or a member, and any corruption the decompressor or a checksum catches, raise a
:class:`~datalane.spec.errors.DataError` naming the file and where the frame starts. Retrying
cannot help, so it is not a storage error. A file cut exactly *between* two frames is a valid
shorter file in both formats - nothing in it says that more was to come - and reads as such,
unless its frames were indexed when the plan was made: then the reader of its last chunk
stops short of the planned end and raises.

**Frames.** :func:`frame_index` lists where each frame starts, in compressed and in
decompressed bytes: what cutting a file into chunks of whole frames, and restarting a read in
the middle of a file, need.

* zstd: a file in the *seekable format* (a skippable frame of magic ``0x184D2A5E`` at the end,
  holding the compressed and decompressed size of every frame, with the footer magic
  ``0x8F92EAB1``) is indexed from that seek table, reading 9 bytes and the table. Any other
  file is walked frame by frame through the headers, without decompressing: the frame header
  (magic, descriptor, window, dictionary id, content size), then each 3-byte block header
  (last flag, type, size) to the next block, and the optional checksum; skippable frames are
  stepped over. A frame's decompressed size comes from its header's content size, or from
  its blocks when they are all raw or RLE; when a frame has neither (pzstd and streaming
  writers omit the content size), the file is decompressed once from that frame on to
  measure it and the frames after it.
* gzip: a member has no length field, so members are found by inflating them with zlib -
  except BGZF members (``bgzip``), which carry their length in a ``BC`` extra field and their
  size in the trailer, so their headers are walked; and a file in which no byte after the
  first could start a member (the bytes ``1f 8b 08`` and a flag byte without reserved bits,
  each candidate tried by inflating 64 KiB from it) is one member without inflating it: most
  ``.gz`` files, written by gzip or pigz, are one member, and learning that costs a scan of
  the file instead of its decompression.

Costs measured on the development machine (one core, JSONL of 2.1x compressibility): a zstd
header walk reads the 3-byte header of every block (a 128 KiB block each) - tens of
milliseconds per GB; decompressing zstd to measure frames without a content size costs about
8 s per GB of compressed data; inflating gzip about 25 s per GB of compressed data (12 s per
GB of text); scanning a one-member gzip file for member starts is a read of the file. An index
that took more than a read is worth keeping: indexes of files of at least
:data:`CACHE_MIN_BYTES` are cached by ``(uri, size, ident)`` under
``$DATALANE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/datalane``, ``~/.cache/datalane``), in
``frames/``; any file there may be deleted at any time, and a cache that cannot be written is
skipped. A cache file is tamper-evident: it starts with a SHA-256 digest of the source file's
identity and of the index, and one that does not match (a flipped bit, a file copied under
another key) is built again, never read as another index. In one process, indexes are kept
in memory (the plan cuts a file, its readers reuse the index).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from datalane.engine.files import SourceFile, open_file
from datalane.spec.errors import DataError, StorageError

__all__ = ["CACHE_MIN_BYTES", "FrameIndex", "clear_index_memo", "frame_index", "frames_begun",
           "known_index", "open_stream"]

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50
SEEK_TABLE_MAGIC = 0x184D2A5E
SEEKABLE_FOOTER_MAGIC = 0x8F92EAB1
GZIP_MAGIC = b"\x1f\x8b\x08"

CACHE_MIN_BYTES = 16 << 20  # smaller files index in well under a second
_INDEX_VERSION = 2  # part of the cache key: bump when an index of the same file would differ

_READ = 1 << 20  # compressed bytes read from the file at a time
_ZSTD_FEED = 32 << 10  # most compressed bytes fed to zstd at a time
_FEED_BLOCKS = 32  # most zstd blocks one call completes: 32 x 128 KiB = 4 MiB of output
_GZIP_OUT = 4 << 20  # most decompressed bytes one zlib call returns
_PEEK = 4096  # bytes read at a header while walking frames (the rest is seeked over)
_PROBE = 64 << 10  # bytes inflated from a possible gzip member start to try it


def _corrupt(uri: str, detail: str) -> DataError:
    return DataError(f"{uri}: the compressed stream is corrupt or truncated: {detail}")


def _u32(b: bytes | memoryview, at: int = 0) -> int:
    return int.from_bytes(b[at:at + 4], "little")


# -- strict streams -----------------------------------------------------------------------------


class _ZstdBlocks:
    """Where the blocks of a zstd stream end, read from their headers as the stream is fed.

    python-zstandard's ``decompressobj`` has no bound on one call's output, and a byte count
    does not bound it either: an RLE block of 4 bytes decompresses to 128 KiB, so 32 KiB of
    input could make 1 GiB (a bomb: a 130 KB file holding a 4 GiB line). A block decompresses
    to at most 128 KiB, so feeding input that completes at most :data:`_FEED_BLOCKS` blocks
    bounds a call's output at 4 MiB. Reading a header costs a few operations per block (128
    KiB of output); ordinary files are fed 32 KiB at a time as before. Bytes it cannot parse
    (not a frame) are fed 256 at a time: the decompressor rejects them."""

    def __init__(self, at: int) -> None:
        self._next = at  # compressed offset of the next structure not yet parsed
        self._in_frame = False  # the next structure is a block header (else a frame start)
        self._checksum = 0  # bytes of checksum after the frame's last block
        self._block_end = -1  # end of the block being fed, not yet complete
        self._lost = False

    def feed(self, at: int, data: memoryview, eof: bool) -> int:
        """How many bytes of ``data`` (starting at compressed offset ``at``) to feed now; 0
        when a header runs past ``data`` and more input is needed first."""
        limit = at + min(len(data), _ZSTD_FEED)
        if self._lost:
            return min(len(data), 256)
        blocks = 0
        while True:
            if self._block_end >= 0:
                if self._block_end > limit:
                    return limit - at
                blocks += 1
                self._block_end = -1
                if blocks >= _FEED_BLOCKS:
                    return self._next_end(at)
            if self._next >= limit:
                return limit - at
            rel = self._next - at
            need = self._parse(data[rel:rel + 18])
            if need < 0:
                self._lost = True
                return max(rel, min(len(data), 256))
            if need > 0:  # the header runs past the data at hand
                if eof or rel > 0:
                    return len(data) if eof else rel
                return 0

    def _next_end(self, at: int) -> int:
        return self._last_end - at

    def _parse(self, head: memoryview) -> int:
        """Parse the structure at ``self._next``: 0 when done, > 0 if ``head`` is too short,
        < 0 if it is not zstd."""
        if not self._in_frame:
            if len(head) < 4:
                return 4
            magic = _u32(head)
            if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
                if len(head) < 8:
                    return 8
                self._next += 8 + _u32(head, 4)
                return 0
            if magic != ZSTD_MAGIC:
                return -1
            if len(head) < 5:
                return 5
            fhd = head[4]
            single, fcs_flag = fhd >> 5 & 1, fhd >> 6
            hlen = 5 + (0 if single else 1) + _DICT_ID_BYTES[fhd & 3] + (
                (1 if single else 0), 2, 4, 8)[fcs_flag]
            if len(head) < hlen:
                return hlen
            self._checksum = 4 if fhd & 0x04 else 0
            self._next += hlen
            self._in_frame = True
            return 0
        if len(head) < 3:
            return 3
        v = int.from_bytes(head[:3], "little")
        last, kind, bsize = v & 1, v >> 1 & 3, v >> 3
        end = self._next + 3 + (1 if kind == 1 else bsize)
        self._block_end = self._last_end = end
        self._next = end
        if last:
            self._next += self._checksum
            self._in_frame = False
        return 0

    _last_end = 0


class _Stream(io.RawIOBase):
    """Decompressed bytes of ``raw`` from compressed offset ``offset`` (a frame start) on.

    ``starts`` collects ``(compressed offset, decompressed offset)`` of each frame begun,
    decompressed offsets counted from ``offset``; ``limit`` frames, if given, end the stream.
    """

    def __init__(self, raw: IO[bytes], uri: str, compression: str, offset: int,
                 limit: int | None = None) -> None:
        super().__init__()
        self._raw = raw
        self._uri = uri
        self._gzip = compression == "gzip"
        if not self._gzip and compression != "zstd":
            raise ValueError(f"unknown compression {compression!r}")
        self._noun = "gzip member" if self._gzip else "zstd frame"
        self._at = offset  # compressed offset of the first byte of _input
        self._input = memoryview(b"")
        self._dec: Any = None
        self._frame = offset  # where the frame being decompressed starts
        self._limit = limit
        self._ended = 0
        self._done = False
        self._out = memoryview(b"")
        self.produced = 0  # decompressed bytes so far
        self.starts: list[tuple[int, int]] = []
        self._zstd: Any = None
        self._blocks = _ZstdBlocks(offset)
        if not self._gzip:
            import zstandard

            self._zstd = zstandard.ZstdDecompressor()
            self._zstd_error: type[Exception] = zstandard.ZstdError

    def readable(self) -> bool:
        return True

    @property
    def offset(self) -> int:
        """Compressed offset of the first byte not yet decompressed."""
        return self._at

    def readinto(self, b: Any) -> int:
        while not self._out:
            if self._done:
                return 0
            self._out = memoryview(self._step())
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def drain(self) -> int:
        """Decompress to the end without keeping the bytes; the decompressed size."""
        while not self._done:
            self._step()
        return self.produced

    def _read(self) -> memoryview:
        try:
            return memoryview(self._raw.read(_READ))
        except OSError as e:
            if isinstance(e, StorageError):
                raise
            raise StorageError(f"cannot read {self._uri} at byte {self._at}: {e}",
                               transient=True) from e

    def _step(self) -> bytes:
        """Decompress some input; b"" when that gave no output (or the stream ended)."""
        if not self._input:
            self._input = self._read()
            if not self._input:
                if self._dec is not None:
                    raise _corrupt(self._uri, f"the {self._noun} that starts at byte "
                                              f"{self._frame} is cut off at the end of the "
                                              f"file (byte {self._at})")
                self._done = True
                return b""
        if self._dec is None:
            if self._gzip and self._input[0] == 0:  # zeros after a member are padding
                padded = bytes(self._input)  # (as Python's gzip reads them)
                stripped = padded.lstrip(b"\0")
                self._at += len(padded) - len(stripped)
                self._input = memoryview(stripped)
                if not stripped:
                    return b""
            self._frame = self._at
            self.starts.append((self._at, self.produced))
            self._dec = zlib.decompressobj(31) if self._gzip else self._zstd.decompressobj()
        dec = self._dec
        data = self._input
        try:
            if self._gzip:  # what is left is a tail of the input: slice it, never copy
                out = dec.decompress(data, _GZIP_OUT)
                rest = data[len(data) - len(dec.unused_data if dec.eof
                                            else dec.unconsumed_tail):]
            else:
                n = self._blocks.feed(self._at, data, False)
                while n == 0:  # a block header runs past the input at hand: read on
                    more = self._read()
                    data = self._input = memoryview(bytes(data) + bytes(more))
                    n = self._blocks.feed(self._at, data, not more)
                piece = data[:n]
                out = dec.decompress(piece)
                rest = data[len(piece) - (len(dec.unused_data) if dec.eof else 0):]
        except zlib.error as e:
            raise _corrupt(self._uri, f"{e} (in the gzip member that starts at byte "
                                      f"{self._frame})") from e
        except Exception as e:
            if self._zstd is not None and isinstance(e, self._zstd_error):
                raise _corrupt(self._uri, f"{e} (in the zstd frame that starts at byte "
                                          f"{self._frame})") from e
            raise
        self._at += len(data) - len(rest)
        self._input = rest
        if dec.eof:
            self._dec = None
            self._ended += 1
            if self._limit is not None and self._ended >= self._limit:
                self._done = True
        self.produced += len(out)
        return out  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_stream(source: str | SourceFile, compression: str, offset: int = 0) -> IO[bytes]:
    """The decompressed bytes of ``source`` from the frame (member) starting at ``offset``.

    Frames follow each other as one stream; the stream raises :class:`DataError` when the file
    ends inside a frame or a frame is corrupt. Not seekable: skip by reading. A
    :class:`SourceFile` is checked to be the file the plan listed (``files.open_file``).
    """
    uri = source.uri if isinstance(source, SourceFile) else source
    raw = open_file(source)
    try:
        if offset:
            raw.seek(offset)
    except OSError as e:
        raw.close()
        raise StorageError(f"cannot seek {uri} to byte {offset}: {e}", transient=True) from e
    return io.BufferedReader(_Stream(raw, uri, compression, offset), buffer_size=_READ)


def frames_begun(stream: IO[bytes]) -> list[tuple[int, int]]:
    """``(compressed, decompressed)`` offsets of the frames (members) that ``stream``, opened
    by :func:`open_stream`, has begun so far, decompressed offsets counted from where it was
    opened: what a reader checks the file's frame index against."""
    raw = getattr(stream, "raw", None)
    if not isinstance(raw, _Stream):
        raise TypeError(f"not a stream of open_stream: {stream!r}")
    return raw.starts


def open_content(sf: SourceFile) -> IO[bytes]:
    """The content of ``sf`` from its start: decompressed (:func:`open_stream`) when the plan
    found it compressed, else its bytes (:func:`~datalane.engine.files.open_file`)."""
    if sf.compression is not None:
        return open_stream(sf, sf.compression)
    return open_file(sf)


# -- frame indexes ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FrameIndex:
    """Where the frames (members) of one compressed file start.

    ``coffsets[i]`` and ``doffsets[i]`` are the compressed and the decompressed offset of the
    start of frame ``i`` (skippable frames are not listed); ``dsize`` is the decompressed size,
    -1 when unknown (a gzip file found to be one member without inflating it).
    """

    coffsets: np.ndarray
    doffsets: np.ndarray
    csize: int
    dsize: int

    @property
    def frames(self) -> int:
        return len(self.coffsets)

    def restart(self, pos: int) -> tuple[int, int]:
        """``(compressed, decompressed)`` offset of the start of the frame holding byte ``pos``
        of the decompressed stream: where to begin decompressing to reach it."""
        i = int(np.searchsorted(self.doffsets, pos, side="right")) - 1
        if i < 0:
            return 0, 0
        return int(self.coffsets[i]), int(self.doffsets[i])

    def boundaries(self, chunk_bytes: int) -> list[int]:
        """Decompressed offsets ``[0, b1, ..., dsize]`` that cut the file into chunks of whole
        frames: ``b_k`` is the start of the first frame at or after ``k * chunk_bytes`` bytes
        of compressed data (consecutive small frames share a chunk; a frame larger than
        ``chunk_bytes`` is a chunk of its own). ``[0, dsize]`` is one chunk."""
        if self.frames <= 1 or self.dsize <= 0:
            return [0, max(self.dsize, 0)]
        targets = np.arange(chunk_bytes, self.csize, chunk_bytes, dtype=np.int64)
        at = np.searchsorted(self.coffsets, targets, side="left")
        cuts = np.unique(self.doffsets[at[at < self.frames]])
        inner = [int(d) for d in cuts if 0 < d < self.dsize]
        return [0, *inner, self.dsize]

    def to_array(self) -> np.ndarray:
        rows = np.empty((self.frames + 1, 2), dtype=np.int64)
        rows[:-1, 0], rows[:-1, 1] = self.coffsets, self.doffsets
        rows[-1] = (self.csize, self.dsize)
        return rows

    @classmethod
    def from_array(cls, rows: np.ndarray) -> FrameIndex:
        return cls(rows[:-1, 0].copy(), rows[:-1, 1].copy(), int(rows[-1, 0]), int(rows[-1, 1]))

    @classmethod
    def of(cls, starts: list[tuple[int, int]], csize: int, dsize: int) -> FrameIndex:
        arr = np.array(starts, dtype=np.int64).reshape(-1, 2)
        return cls(arr[:, 0].copy(), arr[:, 1].copy(), csize, dsize)


_MEMO: dict[tuple[str, int, str], FrameIndex] = {}
_LOCKS: dict[tuple[str, int, str], threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def clear_index_memo() -> None:
    """Forget the indexes kept in memory (the disk cache stays)."""
    _MEMO.clear()


def _key(sf: SourceFile) -> tuple[str, int, str]:
    return (sf.uri, sf.size, sf.ident)


def known_index(sf: SourceFile) -> FrameIndex | None:
    """The index of ``sf`` if this process or the disk cache has it, without building it."""
    got = _MEMO.get(_key(sf))
    if got is None and sf.size >= CACHE_MIN_BYTES:
        got = _load(sf)
        if got is not None:
            _MEMO[_key(sf)] = got
    return got


def frame_index(sf: SourceFile) -> FrameIndex:
    """The frames of compressed file ``sf`` (kept in memory, cached on disk when large)."""
    key = _key(sf)
    got = _MEMO.get(key)
    if got is not None:
        return got
    with _LOCKS_LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        got = _MEMO.get(key)
        if got is None:
            got = _load(sf) if sf.size >= CACHE_MIN_BYTES else None
            if got is None:
                got = _build(sf)
                if sf.size >= CACHE_MIN_BYTES:
                    _store(sf, got)
            _MEMO[key] = got
    return got


def _build(sf: SourceFile) -> FrameIndex:
    if sf.compression not in ("gzip", "zstd"):
        raise ValueError(f"{sf.uri}: no frames to index for compression {sf.compression!r}")
    with open_file(sf) as f:
        if sf.compression == "zstd":
            return _seekable_index(f, sf) or _zstd_index(f, sf)
        return _gzip_index(f, sf)


class _Peeker:
    """Small reads at arbitrary offsets of a raw file, through a little window."""

    def __init__(self, f: IO[bytes], uri: str) -> None:
        self._f = f
        self._uri = uri
        self._at = 0
        self._buf = b""

    def peek(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (fewer at the end of the file)."""
        lo = pos - self._at
        if lo < 0 or lo + n > len(self._buf):
            try:
                self._f.seek(pos)
                self._buf = self._f.read(max(n, _PEEK))
            except OSError as e:
                raise StorageError(f"cannot read {self._uri} at byte {pos}: {e}",
                                   transient=True) from e
            self._at, lo = pos, 0
        return self._buf[lo:lo + n]


def _seekable_index(f: IO[bytes], sf: SourceFile) -> FrameIndex | None:
    """The index from the seek table of a zstd file in the seekable format, or None."""
    size, uri = sf.size, sf.uri
    if size < 17:
        return None
    p = _Peeker(f, uri)
    foot = p.peek(size - 9, 9)
    if len(foot) < 9 or _u32(foot, 5) != SEEKABLE_FOOTER_MAGIC:
        return None
    frames, descriptor = _u32(foot, 0), foot[4]
    if descriptor & 0x7C:
        raise _corrupt(uri, f"the seek table's descriptor {descriptor:#04x} has reserved bits "
                            f"set")
    entry = 12 if descriptor & 0x80 else 8
    table = 8 + frames * entry + 9
    if table > size:
        raise _corrupt(uri, f"the seek table lists {frames} frames, more than the file holds")
    try:
        f.seek(size - table)
        blob = f.read(table - 9)
    except OSError as e:
        raise StorageError(f"cannot read the seek table of {uri}: {e}", transient=True) from e
    if len(blob) != table - 9 or _u32(blob, 0) != SEEK_TABLE_MAGIC or \
            _u32(blob, 4) != frames * entry + 9:
        raise _corrupt(uri, f"the seek table at byte {size - table} is not a skippable frame "
                            f"of magic {SEEK_TABLE_MAGIC:#x} and size {frames * entry + 9}")
    rows = np.frombuffer(blob, dtype="<u4", offset=8).reshape(frames, entry // 4)
    csizes = rows[:, 0].astype(np.int64)
    dsizes = rows[:, 1].astype(np.int64)
    if int(csizes.sum()) != size - table:
        raise _corrupt(uri, f"the seek table's frames add up to {int(csizes.sum())} bytes, but "
                            f"{size - table} bytes precede the table")
    keep = csizes > 0
    coffsets = (np.cumsum(csizes) - csizes)[keep]
    doffsets = (np.cumsum(dsizes) - dsizes)[keep]
    if len(coffsets) and _u32(p.peek(int(coffsets[0]), 4)) != ZSTD_MAGIC:
        raise _corrupt(uri, "the seek table's first frame is not a zstd frame")
    return FrameIndex(coffsets, doffsets, size, int(dsizes.sum()))


_DICT_ID_BYTES = (0, 1, 2, 4)


def _zstd_index(f: IO[bytes], sf: SourceFile) -> FrameIndex:
    """Walk the frame and block headers of a zstd file."""
    size, uri = sf.size, sf.uri
    p = _Peeker(f, uri)
    frames: list[tuple[int, int | None]] = []  # (offset, decompressed size if known)
    pos = 0
    while pos < size:
        head = p.peek(pos, 18)  # the longest frame header: 4 + 1 + 1 + 4 + 8
        if len(head) < 4:
            raise _corrupt(uri, f"the file ends at byte {size} inside the magic number of a "
                                f"frame at byte {pos}")
        magic = _u32(head)
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
            if len(head) < 8 or pos + 8 + _u32(head, 4) > size:
                raise _corrupt(uri, f"the skippable frame at byte {pos} is cut off at the end "
                                    f"of the file (byte {size})")
            pos += 8 + _u32(head, 4)
            continue
        if magic != ZSTD_MAGIC:
            raise _corrupt(uri, f"no zstd frame at byte {pos} (it starts {head[:4].hex()})")
        if len(head) < 5:  # (the header's first byte, the descriptor, is past the end)
            raise _corrupt(uri, f"the zstd frame at byte {pos} is cut off in its header")
        fhd = head[4]
        if fhd & 0x08:
            raise _corrupt(uri, f"the zstd frame at byte {pos} has a reserved header bit set")
        single, fcs_flag = fhd >> 5 & 1, fhd >> 6
        fcs_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
        hlen = 5 + (0 if single else 1) + _DICT_ID_BYTES[fhd & 3] + fcs_bytes
        if len(head) < hlen:
            raise _corrupt(uri, f"the zstd frame at byte {pos} is cut off in its header")
        content: int | None = None
        if fcs_bytes:
            content = int.from_bytes(head[hlen - fcs_bytes:hlen], "little")
            if fcs_bytes == 2:
                content += 256
        block = pos + hlen
        plain = 0  # decompressed bytes of raw and RLE blocks
        measured = True
        while True:
            bh = p.peek(block, 3)
            if len(bh) < 3:
                raise _corrupt(uri, f"the zstd frame that starts at byte {pos} is cut off at "
                                    f"the end of the file (byte {size})")
            v = int.from_bytes(bh, "little")
            last, kind, bsize = v & 1, v >> 1 & 3, v >> 3
            if kind == 3:
                raise _corrupt(uri, f"a block of the zstd frame at byte {pos} has the reserved "
                                    f"type (at byte {block})")
            block += 3 + (1 if kind == 1 else bsize)
            if kind == 2:
                measured = False
            else:
                plain += bsize
            if last:
                break
        end = block + (4 if fhd & 0x04 else 0)
        if end > size:
            raise _corrupt(uri, f"the zstd frame that starts at byte {pos} is cut off at the "
                                f"end of the file (byte {size})")
        if content is None and measured:
            content = plain
        if content is not None and content > (end - pos) << 17:
            # a block of 4 bytes makes at most 128 KiB: no frame holds more than that ratio
            raise _corrupt(uri, f"the zstd frame at byte {pos} claims {content} bytes of "
                                f"content in {end - pos} bytes")
        frames.append((pos, content))
        pos = end
    starts: list[tuple[int, int]] = []
    dpos = 0
    unsized = [i for i, (_, n) in enumerate(frames) if n is None]
    for at, n in frames[:unsized[0] if unsized else len(frames)]:
        starts.append((at, dpos))
        dpos += n or 0
    if unsized:  # measure them: decompress once from the first to the end of the file
        first = frames[unsized[0]][0]
        raw = open_file(sf)
        raw.seek(first)
        with _Stream(raw, uri, "zstd", first) as stream:
            total = stream.drain()
            seen = dict(stream.starts)
        for at, _ in frames[unsized[0]:]:
            if at not in seen:
                raise _corrupt(uri, f"the frame headers put a frame at byte {at}, but "
                                    f"decompressing does not start one there")
            starts.append((at, dpos + seen[at]))
        dpos += total
    return FrameIndex.of(starts, size, dpos)


def _bgzf_length(head: bytes) -> int | None:
    """The length of the gzip member whose header is ``head`` from its BGZF ``BC`` field."""
    if len(head) < 12 or head[:3] != GZIP_MAGIC or not head[3] & 0x04:
        return None
    xlen = int.from_bytes(head[10:12], "little")
    extra = head[12:12 + xlen]
    i = 0
    while i + 4 <= len(extra):
        slen = int.from_bytes(extra[i + 2:i + 4], "little")
        if extra[i:i + 2] == b"BC" and slen == 2 and i + 6 <= len(extra):
            return int.from_bytes(extra[i + 4:i + 6], "little") + 1
        i += 4 + slen
    return None


def _gzip_index(f: IO[bytes], sf: SourceFile) -> FrameIndex:
    size, uri = sf.size, sf.uri
    p = _Peeker(f, uri)
    if _bgzf_length(p.peek(0, 512)) is not None:
        return _bgzf_index(p, sf)
    if not _second_member_possible(f, sf):
        return FrameIndex.of([(0, 0)], size, -1)
    f.seek(0)
    stream = _Stream(f, uri, "gzip", 0)
    dsize = stream.drain()
    return FrameIndex.of(stream.starts, size, dsize)


def _bgzf_index(p: _Peeker, sf: SourceFile) -> FrameIndex:
    """Walk BGZF members by the lengths in their headers (a member without one is inflated)."""
    size, uri = sf.size, sf.uri
    starts: list[tuple[int, int]] = []
    pos = dpos = 0
    while pos < size:
        head = p.peek(pos, 512)
        if head[:1] == b"\0" and _zeros_to_end(p, pos, size):
            break  # padding
        length = _bgzf_length(head)
        if length is None:
            if head[:3] != GZIP_MAGIC:
                raise _corrupt(uri, f"no gzip member at byte {pos} (it starts "
                                    f"{head[:3].hex()})")
            raw = open_file(sf)  # a member without a BC field: inflate it to find its end
            raw.seek(pos)
            with _Stream(raw, uri, "gzip", pos, limit=1) as s:
                isize = s.drain()
                end = s.offset
        else:
            least = 12 + int.from_bytes(head[10:12], "little") + 8  # header and trailer
            if length < least:
                raise _corrupt(uri, f"the BGZF member at byte {pos} gives its length as "
                                    f"{length} bytes, less than its header and trailer "
                                    f"({least} bytes)")
            end = pos + length
            if end > size:
                raise _corrupt(uri, f"the gzip member that starts at byte {pos} is cut off at "
                                    f"the end of the file (byte {size})")
            isize = _u32(p.peek(end - 4, 4))
        starts.append((pos, dpos))
        dpos += isize
        pos = end
    return FrameIndex.of(starts, size, dpos)


def _zeros_to_end(p: _Peeker, pos: int, size: int) -> bool:
    while pos < size:
        piece = p.peek(pos, min(size - pos, _READ))
        if not piece or piece.strip(b"\0"):
            return not piece
        pos += len(piece)
    return True


def _second_member_possible(f: IO[bytes], sf: SourceFile) -> bool:
    """Whether some byte after the first could start a gzip member that inflates.

    Every member starts with ``1f 8b 08`` and a flag byte whose reserved bits are clear (zlib
    refuses others); a candidate is tried by inflating up to 64 KiB from it. If none passes,
    the file is one member (or corrupt, which reading it reports)."""
    size, uri = sf.size, sf.uri
    window = 8 << 20
    pos = 1
    try:
        while pos < size:
            f.seek(pos)
            buf = f.read(window + 3)  # 3 more: the flag byte of a magic at the window's end
            if not buf:
                break
            i = buf.find(GZIP_MAGIC)
            while 0 <= i < window:
                if i + 3 >= len(buf):
                    return True  # a member header cut off at the end: reading it must fail
                if not buf[i + 3] & 0xE0 and _inflates(sf, pos + i):
                    return True
                i = buf.find(GZIP_MAGIC, i + 1)
            pos += window
    except OSError as e:
        raise StorageError(f"cannot read {uri}: {e}", transient=True) from e
    return False


def _inflates(sf: SourceFile, pos: int) -> bool:
    with open_file(sf) as g:
        g.seek(pos)
        data = g.read(_PROBE)
    try:
        zlib.decompressobj(31).decompress(data, 1 << 20)
    except zlib.error:
        return False
    return True


# -- the disk cache -----------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where indexes are cached: ``$DATALANE_CACHE_DIR``, else the user's cache folder."""
    explicit = os.environ.get("DATALANE_CACHE_DIR")
    if explicit:
        return Path(explicit) / "frames"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "datalane" / "frames"


def _identity(sf: SourceFile) -> bytes:
    """What a cached index is of: the file's URI, size, identity, compression (and the index
    layout's version)."""
    return json.dumps([_INDEX_VERSION, sf.uri, sf.size, sf.ident, sf.compression]).encode()


def _cache_path(sf: SourceFile) -> Path | None:
    if sf.ident == "none":  # no way to tell a rewritten file of the same size
        return None
    return cache_dir() / f"{hashlib.sha256(_identity(sf)).hexdigest()[:40]}.frames"


def _seal(sf: SourceFile, payload: bytes) -> bytes:
    """The digest a cache file starts with: SHA-256 of the file's identity and the payload."""
    return hashlib.sha256(_identity(sf) + payload).digest()


def _load(sf: SourceFile) -> FrameIndex | None:
    """The cached index of ``sf``, or None. A cache file is a SHA-256 digest of the source
    file's identity and the payload, then the payload (the index as an ``.npy`` array): any
    byte changed (a flipped bit, a file copied from another key, a torn write) fails the
    digest, and the index is built again - never read as another index."""
    path = _cache_path(sf)
    if path is None:
        return None
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    digest, payload = blob[:32], blob[32:]
    if len(digest) != 32 or digest != _seal(sf, payload):
        return None
    try:
        rows = np.load(io.BytesIO(payload), allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if rows.ndim != 2 or rows.shape[1] != 2 or rows.shape[0] < 1 or rows.dtype != np.int64 \
            or int(rows[-1, 0]) != sf.size:
        return None
    return FrameIndex.from_array(rows)


def _store(sf: SourceFile, index: FrameIndex) -> None:
    path = _cache_path(sf)
    if path is None:
        return
    out = io.BytesIO()
    np.save(out, index.to_array(), allow_pickle=False)
    payload = out.getvalue()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_seal(sf, payload) + payload)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass  # a read-only home: index again next time

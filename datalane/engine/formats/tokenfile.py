"""Token files: little-endian token arrays read in byte ranges, and their document indexes.

Shared by the formats whose files hold token ids only (:mod:`.megatron`, :mod:`.flatbin`).
A file is read through fsspec (a local path or any URI) in ranges of whole documents, at most
:data:`WINDOW_BYTES` at a time unless one document is longer; each document is a numpy view
of the range it was read in (the document kind copies the ids into the sample). A block of a
Megatron source (or of flat files listed in offsets files) is read a span at a time instead
(:func:`span`, up to :data:`SPAN_BYTES`; :mod:`datalane.engine.tokenrecords`). A short read
(a file shorter than its index says) is a DataError naming the file, never a shorter document.

A *document index* lists where each document starts, in tokens: document ``d`` is tokens
``[starts[d], starts[d+1])`` of its file. Indexes are cached per process (keyed by the file's
URI, size and identity), so the lanes of a sidecar share one copy; local index files are
memory-mapped while they are parsed. A document over
:data:`~datalane.spec.limits.MAX_RECORD_BYTES` is not read: it is a bad record ``too_large``.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import numpy as np

from datalane.engine.files import SourceFile, check_unchanged, open_file
from datalane.engine.formats.base import Chunk, TooLarge
from datalane.spec.errors import DataError, StorageError
from datalane.spec.limits import MAX_RECORD_BYTES

__all__ = ["SPAN_BYTES", "WINDOW_BYTES", "TokenFiles", "cached", "cut_documents", "documents",
           "is_local", "load_bytes", "local_path", "span"]

WINDOW_BYTES = 4 << 20  # one read covers whole documents up to this many bytes
SPAN_BYTES = 64 << 20  # a block's documents read at once (span) up to this many bytes
_CACHED = 16  # document indexes kept per process

T = TypeVar("T")
_lock = threading.Lock()
_cache: OrderedDict[tuple[Any, ...], Any] = OrderedDict()


def cached(key: tuple[Any, ...], build: Callable[[], T]) -> T:
    """``build()``, once per ``key`` while it stays among the last few used (thread-safe)."""
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            hit: T = _cache[key]
            return hit
    value = build()
    with _lock:
        _cache[key] = value
        while len(_cache) > _CACHED:
            _cache.popitem(last=False)
    return value


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def load_bytes(source: SourceFile | str) -> Any:
    """The whole content of a (small) file: memory-mapped when local, read when remote; a
    :class:`SourceFile` must still be the file listed (``files.open_file``)."""
    uri = source.uri if isinstance(source, SourceFile) else source
    try:
        if is_local(uri):
            path = local_path(uri)
            import os

            if isinstance(source, SourceFile):
                check_unchanged(source)
            if os.path.getsize(path) == 0:
                return np.zeros(0, dtype=np.uint8)
            return np.memmap(path, dtype=np.uint8, mode="r")
        with open_file(source, ranged=True) as f:
            return np.frombuffer(f.read(), dtype=np.uint8)
    except FileNotFoundError as e:
        raise StorageError(f"{uri} disappeared after planning") from e
    except StorageError:
        raise
    except OSError as e:
        raise StorageError(f"cannot read {uri}: {e}", transient=True) from e


class TokenFiles:
    """The open token files of one reader (the two used last), read as numpy arrays; each
    opened as the file the plan listed (``files.open_file`` checks it)."""

    def __init__(self) -> None:
        self._open: OrderedDict[str, IO[bytes]] = OrderedDict()

    def _file(self, sf: SourceFile) -> IO[bytes]:
        f = self._open.get(sf.uri)
        if f is None:
            f = open_file(sf, ranged=True)
            self._open[sf.uri] = f
            while len(self._open) > 2:
                self._open.popitem(last=False)[1].close()
        else:
            self._open.move_to_end(sf.uri)
        return f

    def read(self, sf: SourceFile, dtype: np.dtype[Any], start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` of ``sf``; DataError if the file ends first."""
        size = dtype.itemsize
        uri = sf.uri
        try:
            f = self._file(sf)
            f.seek(start * size)
            data = f.read(count * size)
        except (StorageError, DataError):
            raise
        except OSError as e:
            self._open.pop(uri, None)
            raise StorageError(f"cannot read {uri} bytes {start * size}-"
                               f"{(start + count) * size}: {e}", transient=True) from e
        if len(data) != count * size:
            raise DataError(f"{uri} ends at byte {start * size + len(data)}, before token "
                            f"{start + count} that its documents reach: the file is "
                            f"truncated or is not the one its index describes")
        return np.frombuffer(data, dtype=dtype)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


def cut_documents(index: int, starts: np.ndarray, itemsize: int, chunk_bytes: int,
                  chunk_rows: int | None) -> list[Chunk]:
    """Chunks of a document-indexed file, in document units: ``chunk_rows`` documents each,
    or else runs of documents starting every ``chunk_bytes`` of token data (a chunk holds the
    documents that *start* in its byte range, so it is never empty)."""
    n = len(starts) - 1
    if n <= 0:
        return []
    if chunk_rows:
        bounds = [*range(0, n, chunk_rows), n]
    else:
        total = int(starts[-1])
        step = max(1, chunk_bytes // itemsize)
        marks = np.arange(0, max(total, 1), step, dtype=np.int64)
        firsts = np.searchsorted(starts[:-1], marks, side="left")  # non-decreasing
        # each once (np.unique would import numpy.ma, 40-70 ms of every plan's clock)
        firsts = firsts[np.concatenate(([True], firsts[1:] != firsts[:-1]))]
        bounds = [int(b) for b in firsts if b < n]
        if not bounds or bounds[0] != 0:
            bounds.insert(0, 0)
        bounds.append(n)
    return [Chunk(index, a, b) for a, b in itertools.pairwise(bounds)]


def span(files: TokenFiles, sf: SourceFile, dtype: np.dtype[Any], starts: np.ndarray,
         chunk: Chunk, start: int | None, most: int,
         ) -> tuple[int, int, np.ndarray, np.ndarray] | None:
    """The next up to ``most`` documents of ``chunk`` from ``start`` (its first if None) in one
    read - the documents :func:`documents` gives one by one - as ``(first, stop, ids,
    offsets)``: documents ``first .. stop - 1``, their ids end to end, where each starts in
    them (``stop - first + 1`` offsets, from 0). None when one is over
    :data:`MAX_RECORD_BYTES` or all of them over :data:`SPAN_BYTES`: read them one by one
    (:func:`documents` names the long ones)."""
    first = chunk.start if start is None else start
    stop = min(chunk.stop, len(starts) - 1, first + most)
    if stop <= first:
        return first, first, np.zeros(0, dtype=dtype), np.zeros(1, dtype=np.int64)
    lo = int(starts[first])
    offs = starts[first:stop + 1].astype(np.int64) - lo
    if int(offs[-1]) * dtype.itemsize > SPAN_BYTES or (
            int(np.diff(offs).max()) * dtype.itemsize > MAX_RECORD_BYTES):
        return None
    return first, stop, files.read(sf, dtype, lo, int(offs[-1])), offs


def documents(files: TokenFiles, sf: SourceFile, dtype: np.dtype[Any], starts: np.ndarray,
              first: int, stop: int) -> Iterator[tuple[int, np.ndarray | TooLarge]]:
    """``(d, tokens)`` of documents ``first .. stop - 1``, read a window at a time; a document
    over :data:`MAX_RECORD_BYTES` is not read (:class:`TooLarge`)."""
    window = max(1, WINDOW_BYTES // dtype.itemsize)
    most = MAX_RECORD_BYTES // dtype.itemsize
    d = first
    while d < stop:
        lo = int(starts[d])
        if int(starts[d + 1]) - lo > most:
            yield d, TooLarge((int(starts[d + 1]) - lo) * dtype.itemsize, "document")
            d += 1
            continue
        # the documents that end within the window (at least one)
        e = int(np.searchsorted(starts, lo + window, side="right")) - 1
        e = min(max(e, d + 1), stop)
        buf = files.read(sf, dtype, lo, int(starts[e]) - lo)
        rel = (starts[d:e + 1] - lo).tolist()
        if rel[-1] <= most:  # every document of the window is within the bound: in bulk
            yield from zip(range(d, e), [buf[a:b] for a, b in itertools.pairwise(rel)],
                          strict=True)
        else:
            for k in range(e - d):
                if rel[k + 1] - rel[k] > most:  # (a window larger than the bound)
                    yield d + k, TooLarge((rel[k + 1] - rel[k]) * dtype.itemsize, "document")
                else:
                    yield d + k, buf[rel[k]:rel[k + 1]]
        d = e

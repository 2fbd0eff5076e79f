"""Flat token files (``flatbin``): a file of token ids back to back, as nanoGPT writes them.

Layout: little-endian ``uint16`` or ``uint32`` token ids and nothing else (no header): what
``np.memmap(path, dtype=np.uint16, mode="w+")`` or ``ids.astype(np.uint16).tofile(path)``
write. The recipe declares how to read it in the source's ``tokens``:

* ``dtype``: ``uint16`` or ``uint32``. Files named ``*.u16`` / ``*.u32`` are inferred as
  flatbin and say their width (a declared ``dtype`` must agree); any other name (nanoGPT's
  ``train.bin``) needs ``format: flatbin`` and ``tokens.dtype``.
* Documents, one of two ways:

  - ``boundary: ID`` - every document ends with the token ``ID`` (kept as its last token:
    nanoGPT appends ``<|endoftext|>`` after each document); ids after the last boundary are
    the last document. A record's position is the index of its first token; chunks are
    ``chunk_bytes`` of the file (a document belongs to the chunk its first token lies in,
    found like a JSONL line: after a boundary token), ``chunk_rows`` does not apply.
  - ``boundary: null`` - an *offsets file* beside the data lists the documents: for
    ``NAME.bin`` (any extension) it is ``NAME.offsets.npy``, a 1-D integer ``.npy``
    (``np.save``) of ``n + 1`` token offsets, ``0`` first, the file's token count last,
    non-decreasing: document ``d`` is tokens ``[offsets[d], offsets[d+1])``. A record's
    position is the document index; chunks are runs of documents (``chunk_rows`` each, or the
    documents starting in each ``chunk_bytes`` of token data), as for Megatron datasets.

A source of this format must set ``tokens`` (ConfigError when the plan is made otherwise); a
file whose size is not a whole number of tokens, an offsets file that does not fit its
data file, or a resume point or reference (a carried piece's) at a token inside a document,
is a DataError naming the file.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from datalane.engine.files import SourceFile, check_unchanged, expand
from datalane.engine.formats.base import Chunk, Decoded, FormatBase, Ref, TooLarge
from datalane.engine.formats.tokenfile import (
    WINDOW_BYTES,
    TokenFiles,
    cached,
    cut_documents,
    documents,
    is_local,
    load_bytes,
    local_path,
    span,
)
from datalane.spec.errors import ConfigError, DataError, StorageError
from datalane.spec.limits import MAX_RECORD_BYTES

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["FLATBIN", "Flatbin", "offsets_path", "read_offsets", "write_flat"]

#: widths a flat file's name may state
_NAMED = {".u16": "uint16", ".u32": "uint32"}


def offsets_path(uri: str) -> str:
    """The offsets file of a flat token file: ``NAME.offsets.npy`` for ``NAME.EXT``."""
    head, tail = posixpath.split(uri)
    stem = tail.rsplit(".", 1)[0] if "." in tail else tail
    return posixpath.join(head, stem + ".offsets.npy") if head else stem + ".offsets.npy"


def read_offsets(source: str | SourceFile, tokens: int) -> np.ndarray:
    """The document offsets in ``source`` (an ``.npy``), checked against a file of ``tokens``
    (a copy in memory: a memory map would change under the reader if the file did)."""
    import io

    uri = source.uri if isinstance(source, SourceFile) else source
    try:
        if is_local(uri):
            if isinstance(source, SourceFile):
                check_unchanged(source)
            offsets = np.load(local_path(uri), mmap_mode="r", allow_pickle=False)
        else:
            offsets = np.load(io.BytesIO(load_bytes(source).tobytes()), allow_pickle=False)
    except FileNotFoundError as e:
        raise StorageError(f"{uri} disappeared after planning") from e
    except (DataError, StorageError):
        raise
    except Exception as e:  # numpy's header parser and reader: ValueError, EOFError, ...
        raise DataError(f"{uri} is not a .npy file of document offsets: {e}") from e
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 1:
        raise DataError(f"{uri} holds a {offsets.dtype} array of shape {offsets.shape}; the "
                        f"document offsets are a 1-D integer array of n + 1 entries")
    if offsets.dtype.itemsize > 8 or (offsets.dtype.kind == "u" and offsets.dtype.itemsize == 8
                                      and len(offsets) and int(offsets.max()) >= 1 << 63):
        raise DataError(f"{uri} holds offsets beyond the range of int64")
    offsets = np.array(offsets, dtype=np.int64)
    if int(offsets[0]) != 0 or int(offsets[-1]) != tokens:
        raise DataError(f"{uri} runs from {int(offsets[0])} to {int(offsets[-1])}, but its "
                        f"documents must cover the {tokens} tokens of the data file from 0")
    steps = np.diff(offsets)
    if len(steps) and int(steps.min()) < 0:
        at = int(np.argmin(steps))
        raise DataError(f"{uri}: offset {at + 1} ({int(offsets[at + 1])}) is below offset "
                        f"{at} ({int(offsets[at])}); offsets never decrease")
    return offsets


@dataclass(frozen=True)
class _Layout:
    dtype: np.dtype[Any]
    boundary: int | None


class FlatbinReader:
    """Documents of one source's flat token files."""

    def __init__(self, files: list[SourceFile], fmt: Flatbin) -> None:
        self._files = files
        self._fmt = fmt
        self._tf = TokenFiles()

    # -- documents listed in an offsets file ---------------------------------------------
    def _indexed(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, Any]]:
        sf = self._files[chunk.file]
        layout = self._fmt.layout(sf)
        starts = self._fmt.offsets(sf, layout)
        first = chunk.start if start is None else start
        return documents(self._tf, sf, layout.dtype, starts, first,
                         min(chunk.stop, len(starts) - 1))

    def span(self, chunk: Chunk, start: int | None, most: int,
             ) -> tuple[int, int, np.ndarray, np.ndarray] | None:
        """The next up to ``most`` documents of ``chunk`` from ``start`` in one read, when an
        offsets file lists them (:func:`~.tokenfile.span`); None: read them one by one (a
        boundary id's documents are found by reading)."""
        sf = self._files[chunk.file]
        layout = self._fmt.layout(sf)
        if layout.boundary is not None:
            return None
        return span(self._tf, sf, layout.dtype, self._fmt.offsets(sf, layout), chunk, start,
                    most)

    # -- documents ended by a boundary token -------------------------------------------------
    def _bounded(self, chunk: Chunk, start: int | None) -> Iterator[tuple[int, Any]]:
        sf = self._files[chunk.file]
        layout = self._fmt.layout(sf)
        boundary = layout.boundary
        assert boundary is not None
        size = layout.dtype.itemsize
        n = sf.size // size
        stop = min(chunk.stop, n)
        window = max(1, WINDOW_BYTES // size)
        # buf holds tokens [at, at + len(buf)); hits: the boundaries in it, found once per read
        buf = np.zeros(0, dtype=layout.dtype)
        hits: list[int] = []
        h = 0
        if start is not None:
            # a resume point or a reference names a document by its first token: one after
            # a boundary (a damaged state would otherwise read a fragment of a document)
            if 0 < start < n:
                before = int(self._tf.read(sf, layout.dtype, start - 1, 1)[0])
                if before != boundary:
                    raise DataError(f"{sf.uri} has no document at token {start} (token "
                                    f"{start - 1} is {before}, not the boundary {boundary}); "
                                    f"did the file change?")
            p = start
        elif chunk.start == 0:
            p = 0
        else:  # the first document that starts at or after chunk.start: after a boundary
            p = chunk.start - 1
            step = 8192
            while True:
                if p >= stop:
                    return
                buf = self._tf.read(sf, layout.dtype, p, min(window, step, n - p))
                hits = np.flatnonzero(buf == boundary).tolist()
                if hits:
                    at, p, h = p, p + hits[0] + 1, 1
                    break
                p += len(buf)
                step *= 2
        if not len(buf):
            at = p
        while p < stop:
            rel = p - at
            while h < len(hits) and hits[h] < rel:
                h += 1
            if h < len(hits):  # the document at p ends at the next boundary
                end = hits[h] + 1
                h += 1
                yield p, buf[rel:end] if (end - rel) * size <= MAX_RECORD_BYTES else TooLarge(
                    (end - rel) * size, "document")
                p = at + end
                continue
            have = at + len(buf)
            if have >= n:  # ids after the last boundary: the last document
                if rel < len(buf):
                    yield p, buf[rel:] if (n - p) * size <= MAX_RECORD_BYTES else TooLarge(
                        (n - p) * size, "document")
                return
            if (have - p) * size > MAX_RECORD_BYTES:  # over the bound: find its end, unkept
                end = self._boundary_after(sf, layout, have, n, window)
                yield p, TooLarge((end - p) * size, "document")
                p = at = end
                buf = buf[:0]
                hits, h = [], 0
                continue
            # the rest of the chunk at once; past its end (the last document), growing steps
            want = max(stop - have, 8192, len(buf) - rel)
            more = self._tf.read(sf, layout.dtype, have, min(window, want, n - have))
            buf = np.concatenate([buf[rel:], more]) if rel < len(buf) else more
            at = p
            hits = np.flatnonzero(buf == boundary).tolist()
            h = 0

    def _boundary_after(self, sf: SourceFile, layout: _Layout, q: int, n: int,
                        window: int) -> int:
        """The token after the first boundary at or after token ``q`` (``n`` if none), read a
        window at a time and not kept."""
        while q < n:
            more = self._tf.read(sf, layout.dtype, q, min(window, n - q))
            hit = np.flatnonzero(more == layout.boundary)
            if len(hit):
                return q + int(hit[0]) + 1
            q += len(more)
        return n

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        if self._fmt.layout(self._files[chunk.file]).boundary is None:
            return self._indexed(chunk, start)
        return self._bounded(chunk, start)

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        sf = self._files[file]
        layout = self._fmt.layout(sf)
        if layout.boundary is None:
            starts = self._fmt.offsets(sf, layout)
            if not 0 <= pos < len(starts) - 1:
                raise DataError(f"{sf.uri} has {len(starts) - 1} documents, no document {pos}; "
                                f"did the file change?")
            return next(documents(self._tf, sf, layout.dtype, starts, pos, pos + 1))[1]
        n = sf.size // layout.dtype.itemsize
        for _, ids in self._bounded(Chunk(file, pos, pos + 1), pos):
            return ids
        raise DataError(f"{sf.uri} has {n} tokens, no document at token {pos}; did the file "
                        f"change?")

    def fields(self, file: int) -> list[str]:
        return []

    def close(self) -> None:
        self._tf.close()


class Flatbin(FormatBase):
    """The flat token format; :meth:`for_source` configures it with the source's layout."""

    name = "flatbin"
    bad_reasons: frozenset[str] = frozenset()
    passes_arrays = True

    def __init__(self, source: str | None = None, dtype: str | None = None,
                 boundary: int | None = None) -> None:
        self._source = source
        self._dtype = dtype
        self._boundary = boundary
        # positions: token indexes with a boundary id, document indexes with offsets files
        self.unit = "token" if boundary is not None else "document"

    def for_source(self, source: Source) -> Flatbin:
        if source.tokens is None:
            raise ConfigError(f"source {source.name!r} reads flat token files (flatbin), which "
                              f"hold token ids, not text; set its `tokens` (at least "
                              f"`tokens: {{dtype: uint16}}`)")
        return Flatbin(source.name, source.tokens.dtype, source.tokens.boundary)

    def _unconfigured(self) -> ConfigError:
        return ConfigError("flatbin files are read with their source's tokens settings "
                           "(dtype, boundary); this reader was opened without a source")

    def layout(self, sf: SourceFile) -> _Layout:
        """How ``sf`` is read: its width (declared, or from a .u16 / .u32 name), boundary."""
        if self._source is None:
            raise self._unconfigured()
        ext = posixpath.splitext(sf.uri)[1].lower()
        named = _NAMED.get(ext)
        if self._dtype is not None and named is not None and named != self._dtype:
            raise ConfigError(f"source {self._source!r}: tokens.dtype is {self._dtype}, but "
                              f"{sf.uri} is named as a {named} file ({ext})")
        dtype = self._dtype or named
        if dtype is None:
            raise ConfigError(f"source {self._source!r}: set tokens.dtype (uint16 or uint32) "
                              f"to read the flat token file {sf.uri}; only *.u16 and *.u32 "
                              f"files say their width")
        np_dtype = np.dtype(dtype).newbyteorder("<")
        if sf.size % np_dtype.itemsize:
            raise DataError(f"{sf.uri} has {sf.size} bytes, not a whole number of {dtype} "
                            f"tokens; is tokens.dtype right?")
        if self._boundary is not None and self._boundary > np.iinfo(np_dtype).max:
            raise ConfigError(f"source {self._source!r}: tokens.boundary {self._boundary} "
                              f"does not fit in {dtype}")
        return _Layout(np_dtype, self._boundary)

    def offsets(self, sf: SourceFile, layout: _Layout) -> np.ndarray:
        """Where each document of ``sf`` starts (its offsets file, cached per process)."""
        uri = offsets_path(sf.uri)

        def build() -> np.ndarray:
            try:
                ((_, size, ident),) = expand(uri, f"the offsets file of {sf.uri}:")
            except ConfigError as e:
                raise ConfigError(
                    f"source {self._source!r}: {sf.uri} has no offsets file {uri}; write the "
                    f"document offsets there (np.save) or set tokens.boundary to the id "
                    f"that ends each document") from e
            listed = SourceFile(uri, size, ident, "flatbin", None)
            return read_offsets(listed, sf.size // layout.dtype.itemsize)

        return cached(("flatbin", sf.uri, sf.size, sf.ident), build)

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        if sf.compression is not None:
            raise ConfigError(f"{sf.uri}: flat token files are read in place; store them "
                              f"uncompressed")
        layout = self.layout(sf)
        size = layout.dtype.itemsize
        if layout.boundary is None:
            return cut_documents(index, self.offsets(sf, layout), size, chunk_bytes, chunk_rows)
        if chunk_rows is not None:
            raise ConfigError(f"source {self._source!r}: chunk_rows does not apply to flat "
                              f"token files with a boundary token (their documents are found "
                              f"by reading); use chunk_bytes")
        n = sf.size // size
        step = max(1, chunk_bytes // size)
        return [Chunk(index, s, min(s + step, n)) for s in range(0, n, step)]

    def reader(self, files: list[SourceFile], field: str) -> FlatbinReader:
        if self._source is None:
            raise self._unconfigured()
        return FlatbinReader(files, self)

    def decode(self, raw: Any, field: str) -> Decoded:
        return raw, None, None

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        return f"set a smaller {where}.chunk_bytes, add files"


FLATBIN = Flatbin()


def write_flat(path: str, docs: Sequence[Any], dtype: str = "uint16",
               offsets: bool = False) -> None:
    """Write ``docs`` back to back as a flat token file (and, with ``offsets``, its
    ``NAME.offsets.npy``), for tests, benchmarks and conversions; local paths."""
    np_dtype = np.dtype(dtype).newbyteorder("<")
    with open(path, "wb") as f:
        for d in docs:
            f.write(np.asarray(d).astype(np_dtype).tobytes())
    if offsets:
        ends = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in docs], out=ends[1:])
        np.save(offsets_path(path), ends)

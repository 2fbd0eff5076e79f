"""Megatron-LM indexed datasets (``MMapIndexedDataset``): ``NAME.idx`` + ``NAME.bin``.

A recipe names the index files (``uris: ["/data/owt_text_document.idx"]``, or a glob of
them); each one's tokens are in the ``.bin`` beside it. Naming the ``.bin`` instead works with
``format: megatron`` (``.bin`` alone is ambiguous: flat token files use it too). A source of
this format must set ``tokens`` (a ConfigError when the plan is made otherwise).

The index, as megatron-core writes it (``megatron/core/datasets/indexed_dataset.py``,
``_IndexWriter``; the layout of Megatron-LM's ``MMapIndexedDataset`` since 2019)::

    9 bytes   magic b"MMIDIDX\\x00\\x00"
    <Q        version, 1
    <B        token type: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16 (6, 7: floats)
    <Q        S, the number of sequences
    <Q        D, the number of document indices (documents + 1)
    S x <i4   sequence lengths, in tokens
    S x <i8   sequence pointers: byte offset of each sequence in the .bin
    D x <i8   document indices: document d is sequences [di[d], di[d+1])
    S x <i1   sequence modes (multimodal datasets only; not read)

The ``.bin`` holds the sequences' tokens back to back. A datalane record is one Megatron
*document* (its sequences together: a sentence-split dataset stores several per document,
``preprocess_data.py`` without ``--split-sentences`` one); its position is the document index.
Chunks are runs of documents: ``chunk_rows`` documents each, or else the documents starting in
each ``chunk_bytes`` of token data, so many lanes share one large dataset. The index is
checked when it is read (magic, version, sizes, sequences back to back, the ``.bin``'s size);
a damaged one is a DataError naming the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from datalane.engine.files import SourceFile, expand
from datalane.engine.formats.base import Chunk, Decoded, FormatBase, Ref
from datalane.engine.formats.tokenfile import (
    TokenFiles,
    cached,
    cut_documents,
    documents,
    load_bytes,
    span,
)
from datalane.spec.errors import ConfigError, DataError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from datalane.spec.recipe import Source

__all__ = ["MAGIC", "MEGATRON", "MegatronIndex", "megatron_paths", "read_index",
           "write_dataset"]

MAGIC = b"MMIDIDX\x00\x00"
_HEADER = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
#: megatron-core's ``DType`` codes
DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64",
          7: "float32", 8: "uint16"}


@dataclass(frozen=True)
class MegatronIndex:
    """One dataset: where its documents start (tokens, n + 1 entries) and its token type."""

    idx_uri: str
    bin_file: SourceFile  # the .bin as listed when the index was read (reads check it)
    dtype: np.dtype[Any]
    starts: np.ndarray  # int64: document d is tokens [starts[d], starts[d+1]) of the .bin

    @property
    def bin_uri(self) -> str:
        return self.bin_file.uri

    @property
    def documents(self) -> int:
        return len(self.starts) - 1


def megatron_paths(uri: str) -> tuple[str, str]:
    """``(NAME.idx, NAME.bin)`` of a dataset named by either file."""
    for ext in (".idx", ".bin"):
        if uri.endswith(ext):
            prefix = uri[:-len(ext)]
            return prefix + ".idx", prefix + ".bin"
    raise ConfigError(f"{uri} is neither a Megatron .idx nor .bin file; name the dataset's "
                      f"index (NAME.idx, with NAME.bin beside it)")


def read_index(idx: str | SourceFile, bin_: str | SourceFile, bin_size: int) -> MegatronIndex:
    """Parse and check one index (see the module docstring for the layout). Listed files
    (:class:`SourceFile`) are checked to be what was listed when they are read."""
    idx_uri = idx.uri if isinstance(idx, SourceFile) else idx
    bin_file = bin_ if isinstance(bin_, SourceFile) else SourceFile(bin_, bin_size, "none",
                                                                    "megatron", None)
    bin_uri = bin_file.uri
    buf = load_bytes(idx)
    size = len(buf)

    def bad(why: str) -> DataError:
        return DataError(f"{idx_uri} is not a Megatron index: {why}")

    if size < _HEADER:
        raise bad(f"{size} bytes, shorter than the {_HEADER}-byte header")
    head = bytes(buf[:_HEADER])
    if head[:9] != MAGIC:
        raise bad(f"it starts with {head[:9]!r}, not the magic {MAGIC!r}")
    version, code, seqs, docs = struct.unpack("<QBQQ", head[9:])
    if version != 1:
        raise bad(f"version {version}; datalane reads version 1")
    name = DTYPES.get(code)
    if name is None:
        raise bad(f"unknown token type code {code}")
    if name.startswith("float"):
        raise DataError(f"{idx_uri} stores {name} tokens; token ids are integers")
    need = _HEADER + seqs * 12 + docs * 8
    if docs < 1 or size < need:
        raise bad(f"{size} bytes, but {seqs} sequences and {docs} document indices need "
                  f"{need}")
    dtype = np.dtype(name).newbyteorder("<")
    lengths = np.frombuffer(buf, dtype="<i4", count=seqs, offset=_HEADER)
    pointers = np.frombuffer(buf, dtype="<i8", count=seqs, offset=_HEADER + seqs * 4)
    doc_index = np.frombuffer(buf, dtype="<i8", count=docs, offset=_HEADER + seqs * 12)
    isz = dtype.itemsize
    if seqs and int(lengths.min()) < 0:
        raise bad(f"sequence {int(np.argmin(lengths))} has a negative length")
    seq_starts = np.zeros(seqs + 1, dtype=np.int64)
    np.cumsum(lengths, out=seq_starts[1:])
    if seqs and not np.array_equal(pointers, seq_starts[:-1] * isz):
        at = int(np.flatnonzero(pointers != seq_starts[:-1] * isz)[0])
        raise bad(f"sequence {at} starts at byte {int(pointers[at])} of the .bin, not right "
                  f"after the sequence before it (byte {int(seq_starts[at]) * isz}); datalane "
                  f"reads datasets whose sequences are stored back to back, as megatron-core "
                  f"writes them")
    if int(doc_index[0]) != 0 or int(doc_index[-1]) != seqs or (
            docs > 1 and int(np.diff(doc_index).min()) < 0):
        raise bad(f"its document indices do not run from 0 to {seqs} in order")
    total = int(seq_starts[-1])
    if bin_size != total * isz:
        raise DataError(f"{bin_uri} has {bin_size} bytes, but its index {idx_uri} describes "
                        f"{total} {name} tokens ({total * isz} bytes); the pair does not "
                        f"belong together or one of them is truncated")
    starts = seq_starts[doc_index]
    return MegatronIndex(idx_uri, bin_file, dtype, starts)


def _index(sf: SourceFile) -> MegatronIndex:
    def build() -> MegatronIndex:
        idx_uri, bin_uri = megatron_paths(sf.uri)
        other = bin_uri if sf.uri == idx_uri else idx_uri
        try:
            ((_, other_size, other_ident),) = expand(other, f"the Megatron dataset of {sf.uri}:")
        except ConfigError as e:
            raise ConfigError(f"{sf.uri} is a Megatron dataset without its "
                              f"{other.rsplit('.', 1)[1]} file: {other} does not exist") from e
        pair = SourceFile(other, other_size, other_ident, "megatron", None)
        if other == bin_uri:
            return read_index(sf, pair, other_size)
        return read_index(pair, sf, sf.size)

    return cached(("megatron", sf.uri, sf.size, sf.ident), build)


class MegatronReader:
    """Documents of one source's Megatron datasets."""

    def __init__(self, files: list[SourceFile], expect: str | None, source: str | None) -> None:
        self._files = files
        self._expect = expect
        self._source = source
        self._tf = TokenFiles()

    def _index(self, file: int) -> MegatronIndex:
        index = _index(self._files[file])
        if self._expect is not None and index.dtype.name != self._expect:
            raise ConfigError(f"source {self._source!r}: tokens.dtype is {self._expect}, but "
                              f"{index.idx_uri} stores {index.dtype.name} tokens")
        return index

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        index = self._index(chunk.file)
        first = chunk.start if start is None else start
        return documents(self._tf, index.bin_file, index.dtype, index.starts, first,
                         min(chunk.stop, index.documents))

    def span(self, chunk: Chunk, start: int | None, most: int,
             ) -> tuple[int, int, np.ndarray, np.ndarray] | None:
        """The next up to ``most`` documents of ``chunk`` from ``start`` in one read
        (:func:`~.tokenfile.span`), or None: read them one by one."""
        index = self._index(chunk.file)
        return span(self._tf, index.bin_file, index.dtype, index.starts, chunk, start, most)

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        index = self._index(file)
        if not 0 <= pos < index.documents:
            raise DataError(f"{index.idx_uri} has {index.documents} documents, no document "
                            f"{pos}; did the file change?")
        return next(documents(self._tf, index.bin_file, index.dtype, index.starts, pos,
                              pos + 1))[1]

    def fields(self, file: int) -> list[str]:
        return []

    def close(self) -> None:
        self._tf.close()


class Megatron(FormatBase):
    name = "megatron"
    unit = "document"
    bad_reasons: frozenset[str] = frozenset()
    passes_arrays = True

    def __init__(self, expect: str | None = None, source: str | None = None) -> None:
        self._expect = expect  # the recipe's tokens.dtype, if it names one
        self._source = source

    def for_source(self, source: Source) -> Megatron:
        if source.tokens is None:
            raise ConfigError(f"source {source.name!r} reads Megatron datasets, which hold "
                              f"token ids, not text; set its `tokens` (for example "
                              f"`tokens: {{}}`)")
        return Megatron(source.tokens.dtype, source.name)

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        if sf.compression is not None:
            raise ConfigError(f"{sf.uri}: Megatron datasets are read in place by document; "
                              f"store them uncompressed")
        idx = MegatronReader([sf], self._expect, self._source)._index(0)
        return cut_documents(index, idx.starts, idx.dtype.itemsize, chunk_bytes, chunk_rows)

    def reader(self, files: list[SourceFile], field: str) -> MegatronReader:
        return MegatronReader(files, self._expect, self._source)

    def decode(self, raw: Any, field: str) -> Decoded:
        return raw, None, None

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        return (f"set a smaller {where}.chunk_bytes (token bytes per chunk) or "
                f"{where}.chunk_rows (documents per chunk), add datasets")


MEGATRON = Megatron()


def write_dataset(prefix: str, docs: Sequence[Any], dtype: str = "uint16") -> None:
    """Write ``docs`` (sequences of token ids, one sequence per document) as the Megatron
    dataset ``prefix.idx`` + ``prefix.bin``: the bytes megatron-core's
    ``IndexedDatasetBuilder.add_document`` + ``finalize`` write (for tests, benchmarks and
    conversions; local paths)."""
    np_dtype = np.dtype(dtype).newbyteorder("<")
    code = {v: k for k, v in DTYPES.items()}[np_dtype.name]
    lengths = np.array([len(d) for d in docs], dtype="<i4")
    pointers = np.zeros(len(docs), dtype="<i8")
    if len(docs) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * np_dtype.itemsize, out=pointers[1:])
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d).astype(np_dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(docs) + 1, dtype="<i8").tobytes())

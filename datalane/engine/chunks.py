"""Chunks and record readers over every format of a source (docs/architecture.md, One lane).

A source file is cut into chunks by its format (:mod:`datalane.engine.formats`): Parquet row
groups or row ranges, plain JSONL byte ranges aligned to newlines, compressed JSONL files
whole. A record's *position* is the format's address of it in its file (a byte offset in the
decompressed stream, a row index); a document's reference is its format's (its file's index
first), so a document can be re-read directly from it. A source may mix formats;
:class:`RecordReader` reads each file with its own. Callers: :mod:`datalane.engine.plan`
(cutting) and :mod:`datalane.engine.docstream`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from datalane.engine.files import SourceFile
from datalane.engine.formats import MISSING, FormatReader, format_for
from datalane.engine.formats.base import Chunk, Ref

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["MISSING", "Chunk", "RecordReader", "cut_file"]


def cut_file(index: int, sf: SourceFile, chunk_bytes: int, chunk_rows: int | None,
             source: Source | None = None) -> list[Chunk]:
    """The chunks of one file, in file order (read as ``source`` reads it, when given)."""
    return format_for(sf.format, source).cut(index, sf, chunk_bytes, chunk_rows)


class RecordReader:
    """Raw records of one source's files, each file read by its format's reader."""

    def __init__(self, files: list[SourceFile], field: str,
                 source: Source | None = None) -> None:
        self._files = files
        self._field = field
        self._source = source
        self._readers: dict[str, FormatReader] = {}

    def _reader(self, file: int) -> FormatReader:
        name = self._files[file].format
        reader = self._readers.get(name)
        if reader is None:
            reader = self._readers[name] = format_for(name, self._source).reader(
                self._files, self._field)
        return reader

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(position, raw)`` of each record of ``chunk``, from ``start`` if given."""
        return self._reader(chunk.file).records(chunk, start)

    def span(self, chunk: Chunk, start: int | None, most: int,
             ) -> tuple[int, int, np.ndarray, np.ndarray] | None:
        """The next up to ``most`` records of ``chunk`` from ``start`` read at once, when its
        file's format reads token documents so (:meth:`.megatron.MegatronReader.span`):
        ``(first, stop, ids, offsets)`` for positions ``first .. stop - 1``; else None."""
        reader = self._reader(chunk.file)
        span = getattr(reader, "span", None)
        return None if span is None else span(chunk, start, most)

    def read_one(self, ref: Ref) -> Any:
        """The raw record a document reference names (for re-reading carried documents)."""
        return self._reader(ref[0]).read_one(ref)

    def fields(self, file: int) -> list[str]:
        """The field names of file ``file``'s records."""
        return self._reader(file).fields(file)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

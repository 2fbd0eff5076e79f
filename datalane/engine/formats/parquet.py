"""Parquet: chunks are row groups (or row ranges of ``chunk_rows`` inside them); a record's
position is its row index in the file, and its value the Python value of the field's column.

Only the field's column is read, one row group at a time; a reader keeps two files open. A
source whose kind reads a record's parts together (vision: an image-bytes column and a caption
column; its configuration's ``document_parts``) gets a configured copy
(:meth:`Parquet.for_source`) that reads every column the parts name and decodes a row to
``{part: value}`` (:mod:`~datalane.engine.formats.columnparts`: binary or Hugging Face's
``Image`` struct, the bad records of a null, a wrong type or a path without bytes).

A pre-tokenized source (``tokens``) reading an integer list column (``list<int32>``,
``large_list<int64>``, ...) gets each row as a numpy view of the column's values, cut at its
offsets, instead of a Python list of Python ints (:func:`_id_lists`): ``to_pylist`` builds one
object per token and was most of the time of such a source.

Arrow's own threads are never used (``pre_buffer=False``, ``use_threads=False``): the file is a
Python file object (:func:`~datalane.engine.files.open_file`: ranged reads, the plan's size
check), so Arrow's I/O and CPU pool threads would call into Python to read it, and such a native
thread alive at interpreter exit aborts the process ("terminate called without an active
exception", SIGABRT: 3 of 37 ``datalane demo`` runs at load 15-22, none in 130 since). The
engine's reader threads already read blocks in parallel; a row group decodes on the one that
reads it.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from datalane.engine.files import SourceFile, open_file
from datalane.engine.formats.base import MISSING, Chunk, Decoded, FormatBase, Ref, TooLarge
from datalane.engine.formats.columnparts import PART_REASONS, decode_parts, part_rows
from datalane.spec.errors import DataError, StorageError
from datalane.spec.limits import MAX_RECORD_BYTES

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["PARQUET"]


def _row_groups(sf: SourceFile) -> list[int]:
    """The rows of each row group, from the footer, checked against each other."""
    import pyarrow.parquet as pq

    with open_file(sf, ranged=True) as f:
        try:
            meta = pq.ParquetFile(f).metadata
            rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        except (DataError, StorageError):
            raise
        except Exception as e:  # pyarrow raises ArrowInvalid and OSError subclasses
            raise _unreadable(sf, e, "its footer") from e
    if any(n < 0 for n in rows) or sum(rows) != meta.num_rows:
        raise DataError(f"{sf.uri} is not a readable Parquet file: its footer gives "
                        f"{meta.num_rows} rows, but its row groups hold {rows[:8]}"
                        f"{'...' if len(rows) > 8 else ''}")
    return rows


def _unreadable(sf: SourceFile, e: Exception, where: str) -> Exception:
    """A failure reading ``sf`` with pyarrow, classified: an error of the file object (an
    OSError subclass, or one with an errno: the storage) is a transient StorageError, and
    anything pyarrow itself refuses (corrupt thrift, pages, encodings) a DataError."""
    import pyarrow as pa

    if isinstance(e, OSError) and not isinstance(e, pa.ArrowException) and (
            type(e) is not OSError or e.errno is not None):
        return StorageError(f"cannot read {where} of {sf.uri}: {e}", transient=True)
    return DataError(f"{sf.uri} is not a readable Parquet file: {e} (in {where})")


class ParquetReader:
    """Records of one source's Parquet files; keeps one decoded row group."""

    def __init__(self, files: list[SourceFile], field: str, ids: bool = False,
                 parts: dict[str, tuple[str, ...]] | None = None) -> None:
        self._files = files
        self._field = field
        self._ids = ids  # integer list columns as numpy views (a pre-tokenized source)
        self._parts = parts  # a kind's parts: each row as {column: value} of their columns
        self._open: OrderedDict[int, Any] = OrderedDict()
        self._group: tuple[int, int, list[Any]] | None = None  # (file, first row, values)

    def _file(self, index: int) -> Any:
        import pyarrow.parquet as pq

        pf = self._open.get(index)
        if pf is None:
            sf = self._files[index]
            f = open_file(sf, ranged=True)
            try:
                pf = pq.ParquetFile(f, pre_buffer=False)  # no Arrow threads (above)
            except Exception as e:
                f.close()
                if isinstance(e, DataError | StorageError):
                    raise
                raise _unreadable(sf, e, "its footer") from e
            self._open[index] = pf
            while len(self._open) > 2:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(index)
        return pf

    def _row_group_of(self, index: int, row: int) -> tuple[int, list[Any]]:
        if self._group and self._group[0] == index and \
                self._group[1] <= row < self._group[1] + len(self._group[2]):
            return self._group[1], self._group[2]
        pf = self._file(index)
        meta = pf.metadata
        first = 0
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            if row < first + rows:
                break
            first += rows
        else:
            raise StorageError(f"{self._files[index].uri} has no row {row}")
        sf = self._files[index]
        values: list[Any]
        try:
            if self._parts is not None:
                names = pf.schema_arrow.names
                wanted = [c for cols in self._parts.values() for c in cols if c in names]
                table = pf.read_row_group(g, columns=list(dict.fromkeys(wanted)),
                                          use_threads=False)
                values = part_rows(self._parts, names, rows, table.column)
            elif self._field in pf.schema_arrow.names:
                column = pf.read_row_group(g, columns=[self._field], use_threads=False).column(0)
                if len(column) != rows:
                    raise DataError(f"{sf.uri}: row group {g} holds {len(column)} values of "
                                    f"{self._field!r}, but its footer says {rows} rows")
                fast = _id_lists(column) if self._ids else None
                try:
                    values = fast if fast is not None else column.to_pylist()
                except UnicodeDecodeError:  # invalid UTF-8 in a string column: per value
                    import pyarrow as pa

                    values = column.cast(pa.binary()).to_pylist()
                for r, size in _oversized(column):
                    values[r] = TooLarge(size, "value")
            else:
                values = [MISSING] * rows
        except (DataError, StorageError):
            raise
        except Exception as e:
            raise _unreadable(sf, e, f"row group {g}") from e
        self._group = (index, first, values)
        return first, values

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        row = chunk.start if start is None else start
        while row < chunk.stop:
            first, values = self._row_group_of(chunk.file, row)
            end = min(chunk.stop, first + len(values))
            for r in range(row, end):
                yield r, values[r - first]
            row = end

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        first, values = self._row_group_of(file, pos)
        return values[pos - first]

    def fields(self, file: int) -> list[str]:
        return list(self._file(file).schema_arrow.names)

    def close(self) -> None:
        self._open.clear()
        self._group = None


class Parquet(FormatBase):
    name = "parquet"
    unit = "row"
    bad_reasons = frozenset({"missing_field"}) | PART_REASONS

    def __init__(self, ids: bool = False,
                 parts: dict[str, tuple[str, ...]] | None = None) -> None:
        self._ids = ids
        self._parts = parts
        self.passes_arrays = parts is None  # (a row of parts is a dict, never an array)

    def for_source(self, source: Source) -> Parquet:
        parts = getattr(source.kind_config, "document_parts", None)
        return Parquet(ids=source.tokens is not None, parts=dict(parts) if parts else None)

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        chunks: list[Chunk] = []
        row = 0
        for rows in _row_groups(sf):
            if rows == 0:  # an empty row group (an empty table is written as one)
                continue
            step = chunk_rows or rows
            chunks.extend(Chunk(index, s, min(s + step, row + rows))
                          for s in range(row, row + rows, step))
            row += rows
        return chunks

    def reader(self, files: list[SourceFile], field: str) -> ParquetReader:
        return ParquetReader(files, field, self._ids, self._parts)

    def decode(self, raw: Any, field: str) -> Decoded:
        if self._parts is not None:
            return decode_parts(raw, self._parts)
        if raw is MISSING or raw is None:
            return None, "missing_field", f"no value in field {field!r}"
        return raw, None, None

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        return f"set a smaller {where}.chunk_rows, add files"


PARQUET = Parquet()


def _oversized(column: Any) -> list[tuple[int, int]]:
    """``(row, bytes)`` of the values of ``column`` over :data:`MAX_RECORD_BYTES` (strings and
    binaries by their bytes, lists by their values' bytes), found from the offsets alone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = column.type
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or \
            pa.types.is_large_binary(t):
        sizes = pc.binary_length(column)
    elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and \
            pa.types.is_primitive(t.value_type):
        sizes = pc.multiply(pc.list_value_length(column).cast(pa.int64()),
                            t.value_type.bit_width // 8 or 1)
    else:
        return []
    big = pc.greater(sizes, MAX_RECORD_BYTES)
    if not pc.any(big).as_py():
        return []
    rows = pc.indices_nonzero(pc.fill_null(big, False)).to_pylist()
    return [(r, int(sizes[r].as_py())) for r in rows]


def _id_lists(column: Any) -> list[Any] | None:
    """The rows of an integer list column as numpy views (None for a null row), or None when
    the column is of another type or has nulls inside a list (those rows go the slow way, so
    the document kind names the null)."""
    import pyarrow as pa

    t = column.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(
            t.value_type):
        return None
    rows: list[Any] = []
    for arr in column.chunks:
        values = arr.values
        if values.null_count:
            return None
        flat = values.to_numpy(zero_copy_only=True)
        offs = arr.offsets.to_numpy(zero_copy_only=True).tolist()
        valid = None if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
        cut = [flat[a:b] for a, b in itertools.pairwise(offs)]
        if valid is not None:
            cut = [c if ok else None for c, ok in zip(cut, valid, strict=True)]
        rows.extend(cut)
    return rows

"""Lance datasets, read with ``pylance`` by fragment and row range.

A source names the dataset directory (``/data/web.lance``, ``s3://bucket/web.lance``); it is
one source file whose identity is the dataset *version* current at plan time, and every
reader opens that version, so rows appended or deleted later change neither the plan nor
the stream (a new version is a new fingerprint, as a changed file is). Lance reads through
its own object store (local paths, ``s3://``, ``gs://``, ``az://``; credentials from the
environment), not through fsspec.

A record's position is its row offset in the dataset version (rows in fragment order, deleted
rows not counted, as ``LanceDataset.take`` addresses them). Chunks never cross a fragment:
each fragment is one chunk, or ranges of ``chunk_rows`` rows of it. A reader reads a chunk
with ``LanceFragment.to_batches(offset=, limit=)`` and only the source's column.

Lance's own metadata (manifests, data file footers) is read by ``pylance`` and cannot be
checked here; whatever it raises for a corrupt dataset (a ``LanceError`` as ValueError,
pyarrow's ArrowInvalid, a Rust panic as pyo3's PanicException) is a DataError naming the
dataset and what was being read; an OSError stays a (transient) StorageError. A value over
:data:`~datalane.spec.limits.MAX_RECORD_BYTES` is a ``too_large`` record, and every batch's
column is validated in full before its values are taken (:func:`arrowvalues.decoded`).

A dataset directory is recognised by what it holds (a ``_versions`` directory), whatever its
name: ``/data/web.lance`` and ``/data/web`` read alike.

``pylance`` is optional (``pip install 'datalane[lance]'``, about 220 MB installed); it is
imported only when a recipe reads Lance.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from datalane.engine.files import SourceFile
from datalane.engine.formats.arrowvalues import decoded
from datalane.engine.formats.base import MISSING, Chunk, Decoded, FormatBase, Listed, Ref
from datalane.spec.errors import ConfigError, DataError, DatalaneError, StorageError
from datalane.spec.limits import TOO_LARGE

__all__ = ["LANCE", "list_lance_directory"]

_IDENT = "lance-version="


@contextmanager
def _lance_errors(uri: str, what: str) -> Iterator[None]:
    """Errors of pylance while reading ``what`` of the dataset ``uri`` as datalane's: an
    OSError a transient StorageError, anything else it raises a DataError."""
    try:
        yield
    except (DatalaneError, GeneratorExit, KeyboardInterrupt, SystemExit):
        raise
    except OSError as e:
        raise StorageError(f"cannot read {what} of the Lance dataset {uri}: {e}",
                           transient=True) from e
    except BaseException as e:  # LanceError (ValueError), ArrowInvalid, PanicException
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        raise DataError(f"the Lance dataset {uri}: {what} cannot be read: "
                        f"{type(e).__name__}: {e}") from e


def _lance() -> Any:
    try:
        import lance
    except ImportError as e:
        raise ConfigError("reading Lance datasets needs pylance: pip install "
                          "'datalane[lance]'") from e
    return lance


def _version(sf: SourceFile) -> int:
    if not sf.ident.startswith(_IDENT):
        raise ConfigError(f"{sf.uri} is not a Lance dataset directory (a source names the "
                          f"dataset, such as /data/web.lance, not its data files)")
    return int(sf.ident[len(_IDENT):])


def _open(sf: SourceFile) -> Any:
    lance = _lance()
    with _lance_errors(sf.uri, f"version {_version(sf)}"):
        return lance.dataset(sf.uri, version=_version(sf))


class _Table:
    """One dataset version: its fragments and the row offset each starts at."""

    def __init__(self, sf: SourceFile) -> None:
        self.ds = _open(sf)
        with _lance_errors(sf.uri, f"the fragments of version {_version(sf)}"):
            self.fragments = list(self.ds.get_fragments())
            counts = [f.count_rows() for f in self.fragments]
            self.names = list(self.ds.schema.names)
        if any(c < 0 for c in counts):
            raise DataError(f"the Lance dataset {sf.uri}: a fragment has {min(counts)} rows")
        self.starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])

    def fragment_of(self, row: int) -> int:
        return int(np.searchsorted(self.starts, row, side="right")) - 1


class LanceReader:
    """Rows of one source's Lance datasets (one open version per dataset)."""

    def __init__(self, files: list[SourceFile], field: str) -> None:
        self._files = files
        self._field = field
        self._tables: dict[int, _Table] = {}

    def _table(self, file: int) -> _Table:
        t = self._tables.get(file)
        if t is None:
            t = self._tables[file] = _Table(self._files[file])
        return t

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        t = self._table(chunk.file)
        row = chunk.start if start is None else start
        if row >= chunk.stop:
            return
        if self._field not in t.names:
            for r in range(row, chunk.stop):
                yield r, MISSING
            return
        k = t.fragment_of(row)
        base = int(t.starts[k])
        uri = self._files[chunk.file].uri
        with _lance_errors(uri, f"rows {row}-{chunk.stop}"):
            batches = t.fragments[k].to_batches(columns=[self._field], offset=row - base,
                                                limit=chunk.stop - row, batch_size=1024)
            for batch in batches:
                for value in decoded(batch.column(0)):
                    if row >= chunk.stop:
                        raise DataError(f"the Lance dataset {uri}: fragment {k} holds more "
                                        f"rows than it counts ({int(t.starts[k + 1]) - base})")
                    yield row, value
                    row += 1

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        t = self._table(file)
        if not 0 <= pos < int(t.starts[-1]):
            raise StorageError(f"{self._files[file].uri} has no row {pos}")
        if self._field not in t.names:
            return MISSING
        with _lance_errors(self._files[file].uri, f"row {pos}"):
            table = t.ds.take([pos], columns=[self._field])
            return decoded(table.column(0).combine_chunks())[0]

    def fields(self, file: int) -> list[str]:
        return list(self._table(file).names)

    def close(self) -> None:
        self._tables.clear()


class Lance(FormatBase):
    name = "lance"
    unit = "row"
    bad_reasons = frozenset({"missing_field", TOO_LARGE})

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        t = _Table(sf)
        chunks: list[Chunk] = []
        for k in range(len(t.fragments)):
            lo, hi = int(t.starts[k]), int(t.starts[k + 1])
            step = chunk_rows or max(hi - lo, 1)
            chunks.extend(Chunk(index, s, min(s + step, hi)) for s in range(lo, hi, step))
        return chunks

    def reader(self, files: list[SourceFile], field: str) -> LanceReader:
        return LanceReader(files, field)

    def decode(self, raw: Any, field: str) -> Decoded:
        if raw is MISSING or raw is None:
            return None, "missing_field", f"no value in column {field!r}"
        return raw, None, None

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        return f"set a smaller {where}.chunk_rows (a fragment is otherwise one chunk)"

    def list_directory(self, fs: Any, path: str) -> Listed | None:
        return list_lance_directory(fs, path)

    def lists(self, ident: str) -> bool:
        return ident.startswith(_IDENT)


LANCE = Lance()


def list_lance_directory(fs: Any, path: str) -> list[tuple[str, int, str]] | None:
    """A Lance dataset directory as one source file (its latest version), or None when the
    directory holds no ``_versions``."""
    root = path.rstrip("/")
    if not fs.isdir(f"{root}/_versions"):
        return None
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    uri = root if protocol in ("file", "local") else fs.unstrip_protocol(root)
    lance = _lance()
    try:
        ds = lance.dataset(uri)
    except BaseException as e:  # LanceError (ValueError), OSError, PanicException
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        raise ConfigError(f"{uri} cannot be opened as a Lance dataset: {type(e).__name__}: "
                          f"{e}") from e
    # the version is the identity (a size would mean listing every data file; it is 0)
    return [(root, 0, f"{_IDENT}{ds.version}")]

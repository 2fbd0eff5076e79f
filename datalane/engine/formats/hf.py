"""Hugging Face datasets: the Arrow files ``save_to_disk`` writes, read with pyarrow directly.

``Dataset.save_to_disk(dir)`` writes ``dir/data-00000-of-0000N.arrow`` (Arrow IPC *stream*
files, in record batches of ``writer_batch_size`` rows), ``dataset_info.json`` and
``state.json`` (whose ``_data_files`` list the Arrow files in order). A source names the
directory (the files ``state.json`` lists are its files) or the Arrow files themselves
(``dir/*.arrow``; any Arrow IPC stream or file, ``.arrow``). A ``DatasetDict`` directory is
refused naming its splits: a source reads one split. A source whose kind reads a record's
parts together (vision: an ``Image`` feature, stored as the struct ``{bytes, path}``, and a
caption column) gets a configured copy (:meth:`Hf.for_source`) that decodes a row to
``{part: value}`` as Parquet does (:mod:`~datalane.engine.formats.columnparts`).

A record's position is its row in the file. At plan time each file's record batches are
found by walking the IPC message headers (8 bytes and a small flatbuffer per batch; the
batches' bodies are skipped), and the file is cut into runs of whole batches of about
``chunk_bytes``, or into row ranges of ``chunk_rows``. A reader reads a chunk's batches with one
ranged read each and decodes them with :func:`pyarrow.ipc.read_record_batch`, so any fsspec
URI works and a remote file is never read whole. Streams with dictionary batches are refused
(``datasets`` does not write them). The value is the Python value of the source's column
(invalid UTF-8 in a string column: bytes, counted ``non_utf8`` by the text kind).

An Arrow file is hostile until checked: the walk reads every flatbuffer field inside its
message, refuses a negative or oversized metadata length, body length or row count with a
DataError naming the file, the message's byte offset and the field (so it always moves
forward and ends), and a batch's row count is bounded by its body where the body is not
compressed. A batch is decoded and its column validated in full before any value is taken
(offsets inside their buffers: a negative one used to be a raw ``SystemError``); anything
pyarrow refuses is a DataError naming the file and the batch. A value over
:data:`~datalane.spec.limits.MAX_RECORD_BYTES` is a ``too_large`` record (the batch holding it
is read, as pyarrow reads batches whole; the value is never made a Python object).

Parquet on the Hugging Face Hub needs no format of its own: an ``hf://datasets/ORG/NAME/...``
URI is opened by ``huggingface_hub``'s fsspec filesystem (``pip install 'datalane[hf]'``) and
its ``.parquet`` files are read by the Parquet format.
"""

from __future__ import annotations

import itertools
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from datalane.engine.files import SourceFile, file_ident, open_file
from datalane.engine.formats.arrowvalues import decoded
from datalane.engine.formats.base import MISSING, Chunk, Decoded, FormatBase, Listed, Ref
from datalane.engine.formats.columnparts import PART_REASONS, decode_parts, part_rows
from datalane.engine.indexfiles import inside, read_index
from datalane.spec.errors import ConfigError, DataError, StorageError
from datalane.spec.limits import TOO_LARGE

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["HF", "ArrowIndex", "arrow_index", "list_hf_directory"]

_CONTINUATION = 0xFFFFFFFF
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3
_FILE_MAGIC = b"ARROW1"
_READ = 8 << 20  # bytes of batches read at once
_MAX_BATCH_ROWS = (1 << 31) - 1  # a compressed batch's rows (its body does not bound them)


@dataclass(frozen=True)
class ArrowIndex:
    """Where the record batches of one Arrow IPC file are."""

    schema_message: bytes  # the Schema message (metadata prefix and flatbuffer)
    starts: np.ndarray  # int64 byte offset of each batch's message
    ends: np.ndarray  # int64 end of each batch's body
    first_rows: np.ndarray  # int64 row of each batch's first row; one more entry: the total

    @property
    def rows(self) -> int:
        return int(self.first_rows[-1])


def _get(fmt: str, buf: bytes, at: int) -> Any:
    """``struct.unpack_from(fmt, buf, at)[0]``, refusing an offset outside ``buf`` (struct
    reads a negative one from the end)."""
    if not 0 <= at <= len(buf) - struct.calcsize(fmt):
        raise struct.error(f"a flatbuffer offset {at} outside the {len(buf)}-byte metadata")
    return struct.unpack_from(fmt, buf, at)[0]


def _field(buf: bytes, table: int, slot: int) -> int | None:
    """Absolute offset of field ``slot`` of the flatbuffer table at ``table``, or None."""
    vtable = table - _get("<i", buf, table)
    vt_size = _get("<H", buf, vtable)
    at = 4 + 2 * slot
    if at + 2 > vt_size:
        return None
    off = _get("<H", buf, vtable + at)
    return table + off if off else None


def _message(meta: bytes) -> tuple[int, int, int, bool]:
    """``(header type, body length, record batch rows, body compressed)`` of a Message
    flatbuffer; struct.error when a field lies outside it."""
    root = _get("<I", meta, 0)
    at = _field(meta, root, 1)
    kind = _get("<B", meta, at) if at is not None else 0
    at = _field(meta, root, 3)
    body = _get("<q", meta, at) if at is not None else 0
    rows, compressed = 0, False
    if kind == _RECORD_BATCH:
        at = _field(meta, root, 2)
        if at is not None:
            header = at + _get("<I", meta, at)
            at = _field(meta, header, 0)
            rows = _get("<q", meta, at) if at is not None else 0
            compressed = _field(meta, header, 3) is not None
    return kind, body, rows, compressed


def _walk(f: IO[bytes], uri: str, size: int) -> ArrowIndex:
    """Index an Arrow IPC stream (or file: the stream after its magic) by its headers."""
    lead = f.read(8)
    pos = 8 if lead[:6] == _FILE_MAGIC else 0
    schema: bytes | None = None
    starts: list[int] = []
    ends: list[int] = []
    rows: list[int] = [0]
    ended = False
    while pos + 4 <= size:
        f.seek(pos)
        prefix = f.read(8)
        if len(prefix) < 4:
            break
        (word,) = struct.unpack_from("<I", prefix, 0)
        if word == _CONTINUATION:
            if len(prefix) < 8:
                break
            (length,) = struct.unpack_from("<i", prefix, 4)
            skip = 8
        else:  # the format before Arrow 0.15: no continuation marker
            length, skip = struct.unpack_from("<i", prefix, 0)[0], 4
        if length == 0:  # end of stream
            ended = True
            break
        if length < 0:
            raise DataError(f"{uri}: the Arrow message at byte {pos} has the metadata length "
                            f"{length}, which is no byte count")
        if (skip == 4 and length < 4) or pos + skip + length > size:
            raise DataError(f"{uri}: the Arrow file is truncated in the message at byte {pos} "
                            f"(its metadata length {length} runs past the file's {size} bytes)")
        meta = f.read(length) if skip == 8 else prefix[4:] + f.read(length - 4)
        if len(meta) < length:
            raise DataError(f"{uri}: the Arrow file is truncated in the message at byte {pos}")
        try:
            kind, body, n, compressed = _message(meta)
        except struct.error as e:
            raise DataError(f"{uri}: no Arrow IPC message at byte {pos} ({e})") from e
        if body < 0:
            raise DataError(f"{uri}: the Arrow message at byte {pos} has the body length "
                            f"{body}, which is no byte count")
        end = pos + skip + length + body
        if end > size:
            raise DataError(f"{uri}: the Arrow file is truncated: the message at byte {pos} "
                            f"ends at byte {end}, the file has {size}")
        if kind == _RECORD_BATCH and not 0 <= n <= (_MAX_BATCH_ROWS if compressed else
                                                     max(8 * body, _EMPTY_ROWS)):
            raise DataError(f"{uri}: the record batch at byte {pos} has the row count {n}, "
                            f"which its {body}-byte body cannot hold")
        if (kind == _SCHEMA) != (schema is None) or kind not in (_SCHEMA, _DICTIONARY,
                                                                  _RECORD_BATCH):
            raise DataError(f"{uri}: the Arrow message at byte {pos} has the type {kind}, where "
                            f"a stream holds {'its schema' if schema is None else 'batches'}")
        if kind == _SCHEMA:
            schema = prefix[:skip] + meta
        elif kind == _DICTIONARY:
            raise ConfigError(f"{uri} holds dictionary-encoded columns, which datalane does not "
                              f"read; decode them before writing (Dataset.flatten_indices / "
                              f"cast to plain types)")
        elif kind == _RECORD_BATCH:
            starts.append(pos)
            ends.append(end)
            rows.append(rows[-1] + n)
        pos = end
    if schema is None:
        raise DataError(f"{uri} is not an Arrow IPC file: no schema message")
    if not ended:  # writers end a stream with a marker; without it, the file was cut short
        raise DataError(f"{uri}: the Arrow file is truncated: it ends at byte {pos} without "
                        f"the end-of-stream marker")
    _check_after_stream(f, uri, size, pos + skip, lead[:6] == _FILE_MAGIC)
    return ArrowIndex(schema, np.array(starts, np.int64), np.array(ends, np.int64),
                      np.array(rows, np.int64))


#: rows a batch of an uncompressed body may claim beyond 8 per body byte (a column needs at
#: least one bit per row; a batch of only null-typed columns has no body at all)
_EMPTY_ROWS = 1 << 16


def _check_after_stream(f: IO[bytes], uri: str, size: int, end: int, is_file: bool) -> None:
    """What follows the end-of-stream marker (ending at byte ``end``) must be nothing in a
    stream, the footer in a file (``footer | int32 footer length | ARROW1``): an end marker
    inside the data (a message length set to 0) would otherwise drop the batches after it."""
    after = size - end
    if is_file and after >= 10:
        f.seek(size - 10)
        tail = f.read(10)
        (footer,) = struct.unpack_from("<i", tail, 0)
        if tail[4:] == _FILE_MAGIC and footer + 10 == after:
            return
    elif not is_file and after == 0:
        return
    raise DataError(f"{uri}: the Arrow stream's end-of-stream marker ends at byte {end}, but "
                    f"the file has {size} bytes, which are no "
                    f"{'file footer' if is_file else 'part of the stream'}")


def _batch_of(index: ArrowIndex, row: int) -> int:
    """The batch that holds ``row`` (batches without rows are never it)."""
    return int(np.searchsorted(index.first_rows, row, side="right")) - 1


_INDEXES: OrderedDict[tuple[str, int, str], ArrowIndex] = OrderedDict()
_LOCK = threading.Lock()


def arrow_index(sf: SourceFile) -> ArrowIndex:
    """The batch index of ``sf``, shared by the plan and every reader in the process."""
    key = (sf.uri, sf.size, sf.ident)
    with _LOCK:
        got = _INDEXES.get(key)
        if got is not None:
            _INDEXES.move_to_end(key)
            return got
    if sf.compression is not None:
        raise ConfigError(f"{sf.uri}: a compressed Arrow file cannot be read by ranges; "
                          f"decompress it (Arrow compresses inside the file: "
                          f"IpcWriteOptions(compression='zstd'))")
    try:
        with open_file(sf) as f:
            index = _walk(f, sf.uri, sf.size)
    except (DataError, ConfigError, StorageError):
        raise
    except OSError as e:
        raise StorageError(f"cannot read {sf.uri}: {e}", transient=True) from e
    with _LOCK:
        _INDEXES[key] = index
        while len(_INDEXES) > 256:
            _INDEXES.popitem(last=False)
    return index


class _Missing(Sequence[Any]):
    """``n`` MISSING values, without a list of them (a batch's row count is the file's)."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        return MISSING


class HfReader:
    """Rows of one source's Arrow files; keeps the last decoded batch."""

    def __init__(self, files: list[SourceFile], field: str,
                 parts: dict[str, tuple[str, ...]] | None = None) -> None:
        self._files = files
        self._field = field
        self._parts = parts  # a kind's parts: each row as {column: value} of their columns
        self._schemas: dict[int, Any] = {}
        self._batch: tuple[int, int, Sequence[Any]] | None = None  # (file, batch, values)

    def _schema(self, file: int) -> Any:
        schema = self._schemas.get(file)
        if schema is None:
            import pyarrow as pa

            index = arrow_index(self._files[file])
            try:
                schema = pa.ipc.read_schema(pa.py_buffer(index.schema_message))
                schema.names  # noqa: B018  (a name that is not UTF-8 raises here, not later)
            except (pa.ArrowException, SystemError, ValueError, OSError) as e:
                raise DataError(f"{self._files[file].uri}: the Arrow schema message cannot be "
                                f"read: {type(e).__name__}: {e}") from e
            self._schemas[file] = schema
        return schema

    def _values(self, file: int, batch: int, message: bytes) -> Sequence[Any]:
        import pyarrow as pa

        schema = self._schema(file)
        index = arrow_index(self._files[file])
        n = int(index.first_rows[batch + 1] - index.first_rows[batch])
        if self._parts is None and self._field not in schema.names:
            return _Missing(n)
        uri = self._files[file].uri
        try:
            rb = pa.ipc.read_record_batch(pa.ipc.read_message(pa.py_buffer(message)), schema)
            if rb.num_rows != n:
                raise ValueError(f"it holds {rb.num_rows} rows, its header {n}")
            if self._parts is not None:
                return part_rows(self._parts, schema.names, n,
                                 lambda c: rb.column(schema.get_field_index(c)))
            return decoded(rb.column(schema.get_field_index(self._field)))
        except (pa.ArrowException, SystemError, ValueError, TypeError, IndexError,
                OSError) as e:
            raise DataError(f"{uri}: record batch {batch} (at byte {int(index.starts[batch])}) "
                            f"cannot be read: {type(e).__name__}: {e}") from e

    def _read(self, file: int, lo: int, hi: int) -> bytes:
        sf = self._files[file]
        try:
            with open_file(sf) as f:
                f.seek(lo)
                buf = f.read(hi - lo)
        except OSError as e:
            raise StorageError(f"cannot read {sf.uri} bytes {lo}-{hi}: {e}",
                               transient=True) from e
        if len(buf) < hi - lo:
            raise DataError(f"{sf.uri}: the Arrow file is truncated: bytes {lo}-{hi} are not "
                            f"all there (did it change after planning?)")
        return buf

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        index = arrow_index(self._files[chunk.file])
        row = chunk.start if start is None else start
        stop = min(chunk.stop, index.rows)
        if row >= stop:
            return
        first = _batch_of(index, row)
        last = _batch_of(index, stop - 1)
        b = first
        while b <= last:
            e = b
            while e < last and int(index.ends[e + 1] - index.starts[b]) <= _READ:
                e += 1
            base = int(index.starts[b])
            buf = self._read(chunk.file, base, int(index.ends[e]))
            for k in range(b, e + 1):
                values = self._values(chunk.file, k, buf[int(index.starts[k]) - base:
                                                        int(index.ends[k]) - base])
                r0 = int(index.first_rows[k])
                for r in range(max(row, r0), min(stop, r0 + len(values))):
                    yield r, values[r - r0]
            b = e + 1

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        index = arrow_index(self._files[file])
        if not 0 <= pos < index.rows:
            raise StorageError(f"{self._files[file].uri} has no row {pos} (it has "
                               f"{index.rows})")
        b = _batch_of(index, pos)
        if self._batch is None or self._batch[:2] != (file, b):
            message = self._read(file, int(index.starts[b]), int(index.ends[b]))
            self._batch = (file, b, self._values(file, b, message))
        return self._batch[2][pos - int(index.first_rows[b])]

    def fields(self, file: int) -> list[str]:
        return list(self._schema(file).names)

    def close(self) -> None:
        self._batch = None
        self._schemas.clear()


class Hf(FormatBase):
    name = "hf"
    unit = "row"
    bad_reasons = frozenset({"missing_field", TOO_LARGE}) | PART_REASONS

    def __init__(self, parts: dict[str, tuple[str, ...]] | None = None) -> None:
        self._parts = parts

    def for_source(self, source: Source) -> Hf:
        parts = getattr(source.kind_config, "document_parts", None)
        return Hf(dict(parts)) if parts else self

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        ix = arrow_index(sf)
        HfReader([sf], "").fields(0)  # the schema pyarrow reads, checked when the plan is
        n = ix.rows
        if n == 0:
            return []
        if chunk_rows is not None:
            return [Chunk(index, s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)]
        full = np.flatnonzero(np.diff(ix.first_rows) > 0)  # batches with rows
        starts = ix.starts[full] - int(ix.starts[full[0]])
        firsts = [0, *(int(c) for c in np.flatnonzero(np.diff(starts // chunk_bytes)) + 1)]
        bounds = [int(ix.first_rows[full[i]]) for i in firsts] + [n]
        return [Chunk(index, a, b) for a, b in itertools.pairwise(bounds)]

    def reader(self, files: list[SourceFile], field: str) -> HfReader:
        return HfReader(files, field, self._parts)

    def decode(self, raw: Any, field: str) -> Decoded:
        if self._parts is not None:
            return decode_parts(raw, self._parts)
        if raw is MISSING or raw is None:
            return None, "missing_field", f"no value in column {field!r}"
        return raw, None, None

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        return (f"set a smaller {where}.chunk_bytes or {where}.chunk_rows (rows per chunk; a "
                f"record batch is otherwise never split)")

    def list_directory(self, fs: Any, path: str) -> Listed | None:
        return list_hf_directory(fs, path)


HF = Hf()


def list_hf_directory(fs: Any, path: str) -> list[tuple[str, int, str]] | None:
    """The Arrow files of a ``save_to_disk`` directory, in ``state.json``'s order; None when
    the directory is none."""
    root = path.rstrip("/")
    dataset_dict = read_index(fs, f"{root}/dataset_dict.json", "a DatasetDict's index")
    splits = dataset_dict.get("splits", []) if isinstance(dataset_dict, dict) else None
    if dataset_dict is not None and not isinstance(splits, list):
        raise ConfigError(f"{root}/dataset_dict.json cannot be read: its splits are "
                          f"{splits!r}, not a list")
    if splits is not None:
        raise ConfigError(f"{root} is a Hugging Face DatasetDict with the splits "
                          f"{', '.join(map(str, splits))}; name one split's directory "
                          f"({root}/{splits[0] if splits else 'train'})")
    state = read_index(fs, f"{root}/state.json", "a save_to_disk state")
    if state is None:
        return None
    try:
        names = [inside(d["filename"], f"{root}/state.json", f"data file {k}")
                 for k, d in enumerate(state["_data_files"])]
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{root}/state.json lists no _data_files ({type(e).__name__}: "
                          f"{e}); is it a save_to_disk directory?") from e
    out = []
    for name in names:
        try:
            info = fs.info(f"{root}/{name}")
        except FileNotFoundError as e:
            raise ConfigError(f"{root}/state.json lists {name}, which is not there") from e
        out.append((f"{root}/{name}", int(info["size"]), file_ident(info)))
    return out

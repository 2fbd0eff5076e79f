"""MosaicML Streaming (MDS) shards, read by datalane's own reader of the shard format.

An MDS dataset is a directory of shards (``shard.00000.mds``, or ``shard.00000.mds.zstd``
when written with compression) listed by ``index.json``. A shard is self-describing::

    uint32 n | uint32 offsets[n + 1] | JSON config | sample 0 | ... | sample n-1

``offsets`` are absolute byte offsets of the samples (``offsets[n]`` is the end of the file),
and the JSON config repeats the index's column names, encodings and fixed sizes. A sample is
the uint32 sizes of its variable-size columns, then every column's bytes, in column order.

A source names the shards (``dir/*.mds``) or the dataset directory (its ``index.json`` lists
the shards, in the index's order; a merged index's subdirectories too). A record's position
is the sample's index in its shard. Plain shards are cut into ranges of ``chunk_rows``
samples, or of about ``chunk_bytes`` of sample data, so many lanes share one shard;
compressed shards (``.zstd``, ``.gz``) are one chunk each, streamed from their start.

The reader is this module rather than the ``mosaicml-streaming`` package: the format is a
page of code, and the package pins numpy, transformers and huggingface_hub versions that
conflict with the engine's, and pulls in cloud SDKs the sidecar does not need. The value of
the source's column is decoded as Streaming's encodings define it: ``str`` (UTF-8; invalid
bytes are a ``non_utf8`` record), ``bytes``, ``json`` (parsed; ``malformed_json`` when not),
the integer and float scalars, ``str_int`` / ``str_float`` / ``str_decimal``, and
``ndarray[:dtype[:shape]]`` (a numpy array, for token ids). ``pkl`` is refused (unpickling
data runs arbitrary code) and image encodings are no documents.

Shards and indexes are hostile until checked: the offset table and the column config must fit
in the file (at most :data:`~datalane.spec.limits.MAX_RECORD_BYTES` each in a compressed
shard), the offsets ascend, every fixed column size is a non-negative integer, the source's
column has an encoding this reader knows, and a sample's column sizes add up to exactly its
bytes (``malformed_sample`` otherwise); a sample over ``MAX_RECORD_BYTES`` is a ``too_large``
record, never read. An ``index.json`` names its shards by paths inside the dataset directory:
an absolute basename or one with a ``..`` component is refused, as is an index nested deeper
than the JSON parser's limit.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import IO, Any, NoReturn

import numpy as np

from datalane.engine.compressed import open_content
from datalane.engine.files import SourceFile, file_ident
from datalane.engine.formats.base import Chunk, Decoded, FormatBase, Listed, Ref
from datalane.engine.indexfiles import inside, read_index
from datalane.spec.errors import ConfigError, DataError, StorageError
from datalane.spec.limits import MAX_RECORD_BYTES, TOO_LARGE

__all__ = ["MDS", "MdsShard", "list_mds_directory", "read_shard_header"]

_SCALARS = {"uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "int8": "<i1",
            "int16": "<i2", "int32": "<i4", "int64": "<i8", "float16": "<f2",
            "float32": "<f4", "float64": "<f8", "int": "<i8"}
_TEXTUAL = {"str", "bytes", "json", "str_int", "str_float", "str_decimal"}
_IMAGES = {"pil", "jpeg", "png", "jpeg_array", "jpegarray", "list[pil]", "list[jpeg]",
           "list[png]"}
# NDArray's codes (streaming.base.format.mds.encodings.NDArray)
_ND_SHAPE = {0: "<u1", 1: "<u2", 2: "<u4", 3: "<u8"}
_ND_VALUE = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
             33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}


@dataclass(frozen=True)
class MdsShard:
    """The header of one shard: sample offsets and columns."""

    offsets: np.ndarray  # uint64, n + 1 absolute byte offsets
    names: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1


def read_shard_header(f: IO[bytes], uri: str, size: int | None) -> MdsShard:
    """Parse a shard's header from ``f`` (at the start of the decompressed shard); ``size``:
    the shard's bytes (None: compressed, its decompressed size unknown)."""
    head = f.read(4)
    if len(head) < 4:
        raise DataError(f"{uri} is not an MDS shard: {len(head)} bytes long")
    (n,) = struct.unpack("<I", head)
    room = MAX_RECORD_BYTES if size is None else size - 4
    if 4 * (n + 1) > room:
        raise DataError(f"{uri} is not an MDS shard: its sample count {n} needs an offset "
                        f"table of {4 * (n + 1)} bytes, more than the "
                        f"{'shard holds' if size is not None else 'bound on a header'} "
                        f"({room} bytes)")
    table = f.read(4 * (n + 1))
    if len(table) < 4 * (n + 1):
        raise DataError(f"{uri}: the MDS shard is truncated inside its offset table "
                        f"({n} samples)")
    offsets = np.frombuffer(table, dtype="<u4").astype(np.uint64)
    start = 4 + 4 * (n + 1)
    if int(offsets[0]) < start or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise DataError(f"{uri} is not an MDS shard: its sample offsets are not ascending "
                        f"from the end of the header")
    if int(offsets[0]) - start > (MAX_RECORD_BYTES if size is None else size - start):
        raise DataError(f"{uri} is not an MDS shard: its column config would end at byte "
                        f"{int(offsets[0])} (the first sample's offset), past "
                        f"{'the shard' if size is not None else 'the bound on a header'}")
    config = f.read(int(offsets[0]) - start)
    try:
        obj = json.loads(config)
        names = tuple(str(c) for c in obj["column_names"])
        encodings = tuple(str(c) for c in obj["column_encodings"])
        sizes = tuple(_fixed_size(s) for s in obj["column_sizes"])
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise DataError(f"{uri} is not an MDS shard: its column config cannot be read "
                        f"({type(e).__name__}: {e})") from e
    if not len(names) == len(encodings) == len(sizes):
        raise DataError(f"{uri}: the MDS shard's column names, encodings and sizes differ in "
                        f"length")
    return MdsShard(offsets, names, encodings, sizes)


def _fixed_size(s: Any) -> int | None:
    """A column_sizes entry: None (variable size) or a byte count."""
    if s is None:
        return None
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise ValueError(f"the column size {s!r} is no byte count")
    return s


@dataclass(frozen=True)
class _Column:
    """Where the source's column is in a sample of a shard."""

    index: int  # column number
    encoding: str
    fixed: tuple[int | None, ...]  # every column's fixed size (None: variable)
    variable: int  # how many columns are variable-size (their sizes head the sample)


@dataclass(frozen=True)
class MdsSample:
    """A raw record: one sample's bytes and where the source's column lies in it."""

    data: bytes
    column: _Column | None  # None: the shard has no such column
    oversize: int | None = None  # the sample's bytes, when over MAX_RECORD_BYTES (not read)


def _column_of(shard: MdsShard, field: str, uri: str) -> _Column | None:
    if field not in shard.names:
        return None
    index = shard.names.index(field)
    encoding = shard.encodings[index]
    base = encoding.split(":", 1)[0]
    if encoding == "pkl":
        raise ConfigError(f"{uri}: column {field!r} is encoded as pkl (pickle); datalane never "
                          f"unpickles data, since that runs arbitrary code; rewrite the column "
                          f"as str, bytes or json")
    if base in _IMAGES:
        raise ConfigError(f"{uri}: column {field!r} holds images ({encoding}); a source reads "
                          f"text (str, bytes, json) or token ids (ndarray, integers)")
    known = _ndarray_encoding(encoding) if base == "ndarray" else (
        encoding in _TEXTUAL or encoding in _SCALARS)
    if not known:
        raise ConfigError(f"{uri}: column {field!r} has the MDS encoding {encoding!r}, which "
                          f"datalane does not know")
    variable = sum(1 for s in shard.sizes if s is None)
    return _Column(index, encoding, shard.sizes, variable)


def _ndarray_encoding(encoding: str) -> bool:
    """Whether ``ndarray[:dtype[:shape]]`` names one of Streaming's dtypes and a shape of
    non-negative sizes."""
    args = encoding.split(":")[1:]
    if len(args) > 2 or (args and args[0] and args[0] not in _ND_VALUE.values()):
        return False
    return len(args) < 2 or all(d.isdigit() for d in args[1].split(","))


def _field_bytes(sample: MdsSample) -> bytes | None:
    """The bytes of the source's column in the sample, or None unless the column sizes add up
    to the sample's bytes (Streaming writes the sizes, then every column, nothing more)."""
    col = sample.column
    assert col is not None
    data = sample.data
    head = 4 * col.variable
    if len(data) < head:
        return None
    var_sizes = iter(struct.unpack_from(f"<{col.variable}I", data, 0))
    sizes = [fixed if fixed is not None else next(var_sizes) for fixed in col.fixed]
    if head + sum(sizes) != len(data):
        return None
    pos = head + sum(sizes[:col.index])
    return data[pos:pos + sizes[col.index]]


def _ndarray(encoding: str, data: bytes) -> np.ndarray:
    args = encoding.split(":")[1:]
    pos = 0
    if args and args[0]:
        dtype = args[0]
    else:
        dtype = _ND_VALUE[data[0]]
        pos = 1
    if len(args) >= 2:
        shape: tuple[int, ...] = tuple(int(d) for d in args[1].split(","))
    else:
        byte = data[pos]
        ndim, code = byte >> 2, byte & 3
        width = 1 << code
        shape = tuple(int(d) for d in np.frombuffer(data, _ND_SHAPE[code], ndim, pos + 1))
        pos += 1 + ndim * width
    return np.frombuffer(data, np.dtype(dtype).newbyteorder("<"), offset=pos).reshape(shape)


def _value(encoding: str, data: bytes) -> Decoded:
    base = encoding.split(":", 1)[0]
    if base == "str":
        try:
            return data.decode("utf-8"), None, None
        except UnicodeDecodeError:
            return data, None, None  # the text kind counts it as non_utf8, with the byte
    if base == "bytes":
        return data, None, None
    if base == "json":
        try:
            return json.loads(data), None, None
        except UnicodeDecodeError as e:
            return None, "non_utf8", f"invalid UTF-8 at byte {e.start} of the JSON value"
        except RecursionError:
            return None, "malformed_json", "JSON nested deeper than the parser's limit"
        except ValueError as e:
            return None, "malformed_json", f"JSON the parser refuses: {e}"
    try:
        if base in _SCALARS:
            dtype = np.dtype(_SCALARS[base])
            if len(data) != dtype.itemsize:
                raise ValueError(f"{len(data)} bytes for a {base}")
            return np.frombuffer(data, dtype)[0].item(), None, None
        if base == "ndarray":
            return _ndarray(encoding, data), None, None
        text = data.decode("utf-8")
        if base == "str_int":
            return int(text), None, None
        if base == "str_float":
            return float(text), None, None
        return Decimal(text), None, None
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, InvalidOperation) as e:
        return None, "malformed_sample", f"the {encoding} value cannot be decoded: {e}"


class MdsReader:
    """Samples of one source's MDS shards; keeps the headers of a few shards."""

    def __init__(self, files: list[SourceFile], field: str) -> None:
        self._files = files
        self._field = field
        self._headers: OrderedDict[int, tuple[MdsShard, _Column | None]] = OrderedDict()

    def _header(self, file: int) -> tuple[MdsShard, _Column | None]:
        got = self._headers.get(file)
        if got is None:
            sf = self._files[file]
            with _open(sf) as f:
                shard = read_shard_header(f, sf.uri, _size(sf))
            got = (shard, _column_of(shard, self._field, sf.uri))
            self._headers[file] = got
            while len(self._headers) > 4:
                self._headers.popitem(last=False)
        else:
            self._headers.move_to_end(file)
        return got

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        sf = self._files[chunk.file]
        shard, column = self._header(chunk.file)
        first = chunk.start if start is None else start
        stop = shard.samples if chunk.stop < 0 else min(chunk.stop, shard.samples)
        if first >= stop:
            return
        offsets = shard.offsets
        if column is None:  # the shard has no such column: every sample lacks the field
            for i in range(first, stop):
                yield i, MdsSample(b"", None)
            return
        with _open(sf) as f:
            _seek(f, 0, int(offsets[first]), sf)
            step = 1 << 22  # read in pieces of about 4 MiB of samples
            i = first
            while i < stop:
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                if hi - lo > MAX_RECORD_BYTES:  # never read: seek (or stream) past it
                    yield i, MdsSample(b"", column, hi - lo)
                    _seek(f, lo, hi, sf)
                    i += 1
                    continue
                j = i + 1
                while j < stop and int(offsets[j + 1]) - int(offsets[i]) <= step:
                    j += 1
                base = int(offsets[i])
                buf = _read_exactly(f, int(offsets[j]) - base, sf, base)
                for k in range(i, j):
                    yield k, MdsSample(buf[int(offsets[k]) - base:int(offsets[k + 1]) - base],
                                       column)
                i = j

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        sf = self._files[file]
        shard, column = self._header(file)
        if not 0 <= pos < shard.samples:
            raise StorageError(f"{sf.uri} has no sample {pos} (it holds {shard.samples})")
        if column is None:
            return MdsSample(b"", None)
        lo, hi = int(shard.offsets[pos]), int(shard.offsets[pos + 1])
        if hi - lo > MAX_RECORD_BYTES:
            return MdsSample(b"", column, hi - lo)
        with _open(sf) as f:
            _seek(f, 0, lo, sf)
            return MdsSample(_read_exactly(f, hi - lo, sf, lo), column)

    def fields(self, file: int) -> list[str]:
        return list(self._header(file)[0].names)

    def close(self) -> None:
        self._headers.clear()


def _open(sf: SourceFile) -> IO[bytes]:
    return open_content(sf)


def _size(sf: SourceFile) -> int | None:
    """The bytes of the shard as the reader sees it (None: compressed, not known)."""
    return sf.size if sf.compression is None else None


def _seek(f: IO[bytes], at: int, pos: int, sf: SourceFile) -> None:
    """Move ``f`` from byte ``at`` to byte ``pos`` of the shard."""
    if sf.compression is None:
        f.seek(pos)
        return
    left = pos - at  # a decompressing stream: read forward
    while left:
        got = f.read(min(left, 1 << 20))
        if not got:
            raise DataError(f"{sf.uri}: the compressed MDS shard ends before byte {pos}")
        left -= len(got)


def _read_exactly(f: IO[bytes], n: int, sf: SourceFile, at: int) -> bytes:
    try:
        buf = f.read(n)
    except Exception as e:
        _reraise(e, sf.uri)
    if len(buf) < n:
        raise DataError(f"{sf.uri}: the MDS shard is truncated: samples from byte {at} need "
                        f"{n} bytes, {len(buf)} are there")
    return buf


def _reraise(e: Exception, uri: str) -> NoReturn:
    from datalane.engine.formats.jsonl import _raise_read_error

    _raise_read_error(e, uri)


class Mds(FormatBase):
    name = "mds"
    unit = "sample"
    bad_reasons = frozenset({"missing_field", "malformed_sample", "malformed_json",
                             "non_utf8", TOO_LARGE})

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        try:
            with _open(sf) as f:
                shard = read_shard_header(f, sf.uri, _size(sf))
        except DataError:
            raise
        except Exception as e:
            _reraise(e, sf.uri)
        n = shard.samples
        if n == 0:
            return []
        if sf.compression is not None:
            return [Chunk(index, 0, n)]
        end = int(shard.offsets[-1])
        if sf.size < end:
            raise DataError(f"{sf.uri}: the MDS shard is truncated: its samples end at byte "
                            f"{end}, the file has {sf.size}")
        if chunk_rows is not None:
            return [Chunk(index, s, min(s + chunk_rows, n)) for s in range(0, n, chunk_rows)]
        # about chunk_bytes of sample data each; a sample belongs to the chunk it starts in
        starts = shard.offsets[:-1].astype(np.int64) - int(shard.offsets[0])
        cuts = np.flatnonzero(np.diff(starts // chunk_bytes)) + 1
        bounds = [0, *(int(c) for c in cuts), n]
        return [Chunk(index, a, b) for a, b in itertools.pairwise(bounds)]

    def reader(self, files: list[SourceFile], field: str) -> MdsReader:
        return MdsReader(files, field)

    def decode(self, raw: Any, field: str) -> Decoded:
        sample: MdsSample = raw
        if sample.column is None:
            return None, "missing_field", f"no column {field!r} in the shard"
        if sample.oversize is not None:
            return None, TOO_LARGE, (f"the sample holds {sample.oversize} bytes, more than the "
                                     f"{MAX_RECORD_BYTES} a record may hold")
        data = _field_bytes(sample)
        if data is None:
            return None, "malformed_sample", (f"the sample's column sizes do not add up to its "
                                              f"{len(sample.data)} bytes")
        return _value(sample.column.encoding, data)

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        if all(f.compression is not None for f in files if f.format == self.name):
            return "compressed MDS shards are one chunk each: write more shards (a smaller " \
                   "size_limit) or uncompressed ones"
        return f"set a smaller {where}.chunk_bytes or {where}.chunk_rows (samples per chunk)"

    def list_directory(self, fs: Any, path: str) -> Listed | None:
        return list_mds_directory(fs, path)


MDS = Mds()


def list_mds_directory(fs: Any, path: str) -> list[tuple[str, int, str]] | None:
    """The shards an MDS dataset directory's ``index.json`` lists (its uncompressed shard
    where it is there, else the compressed one), or None when there is no index."""
    index_path = f"{path.rstrip('/')}/index.json"
    index = read_index(fs, index_path, "an MDS index")
    if index is None:
        return None
    try:
        shards = index["shards"]
        if not isinstance(shards, list):
            raise TypeError(f"'shards' is a {type(shards).__name__}, not a list")
    except (KeyError, TypeError) as e:
        raise ConfigError(f"{index_path} is not an MDS index: {type(e).__name__}: {e}") from e
    out: list[tuple[str, int, str]] = []
    for k, shard in enumerate(shards):
        if not isinstance(shard, dict) or shard.get("format") != "mds":
            fmt = shard.get("format") if isinstance(shard, dict) else type(shard).__name__
            raise ConfigError(f"{index_path}: shard {k} is in the {fmt!r} format; datalane "
                              f"reads MDS shards (format 'mds')")
        candidates = [shard.get("raw_data"), shard.get("zip_data")]
        for info in candidates:
            if not isinstance(info, dict) or not info.get("basename"):
                continue
            name = inside(info["basename"], index_path, f"shard {k}'s basename")
            shard_path = f"{path.rstrip('/')}/{name}"
            try:
                stat = fs.info(shard_path)
            except FileNotFoundError:
                continue
            out.append((shard_path, int(stat["size"]), file_ident(stat)))
            break
        else:
            names = [i.get("basename") for i in candidates if isinstance(i, dict)]
            raise ConfigError(f"{index_path}: shard {k} ({', '.join(map(str, names))}) is "
                              f"missing from {path}")
    return out


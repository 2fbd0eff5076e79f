"""WebDataset tars: a sample is the run of consecutive members that share a key.

A member ``dir/000123.txt`` has the key ``dir/000123`` and the extension ``txt`` (the name up
to its first dot, as the ``webdataset`` package splits it; extensions are lowercased). A
source's ``text_field`` names the *extension* of the member that holds its document
(``text_field: txt``); the member's bytes are the value (UTF-8 text for the text kind), and a
member whose extension ends in ``json`` is parsed as JSON (so a chat source can read
conversations from ``.json`` members). A sample without that member is a ``missing_field``
record; two members of one sample with the same extension a ``malformed_sample``.

A source whose kind reads a record's parts together (``vision``: an image member, one of
``jpg|jpeg|png|webp``, and a caption member; its configuration's ``document_parts``) gets a
configured copy (:meth:`WebDataset.for_source`) that keeps every member of those extensions and
decodes a sample to ``{part: bytes}``: a part without a member is ``missing_field``, a part
in two members (``.jpg`` and ``.png``) ``malformed_sample``, one over the record bound
``too_large``.

A record's position is the byte offset of the sample's first tar header, so a document is
re-read (and a lane resumed) by one seek. Plain tars are indexed at plan time by walking their
512-byte headers (seeking over the members' data) and cut at sample boundaries into ranges of
``chunk_rows`` samples, or of about ``chunk_bytes``; the walk also checks the archive is whole
(every member inside the file, the end-of-archive block present). Compressed tars
(``.tar.gz``, ``.tar.zst``) cannot be entered in the middle: each is one chunk, read as a
stream. Headers are read by this module (ustar, GNU long names, pax ``path``/``size``
records) rather than by :mod:`tarfile`, which keeps every member it has seen in memory.

A tar is hostile until checked: every header's checksum is verified, its size must be a
non-negative octal (or base-256) number and a pax ``size`` a decimal one, every member must
lie inside the file, and a GNU long name or pax header may hold at most
:data:`~datalane.spec.limits.MAX_RECORD_BYTES`; anything else stops the walk with a DataError
naming the file, the header's byte offset and the field. Each header moves the walk forward
by at least one block, so a walk ends. A selected member over ``MAX_RECORD_BYTES`` is never
read: the sample is a ``too_large`` bad record.
"""

from __future__ import annotations

import itertools
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, NoReturn

import numpy as np

from datalane.engine.compressed import open_content
from datalane.engine.files import SourceFile
from datalane.engine.formats.base import Chunk, Decoded, FormatBase, Ref
from datalane.spec.errors import DataError, StorageError
from datalane.spec.limits import MAX_RECORD_BYTES, TOO_LARGE

if TYPE_CHECKING:
    from datalane.spec.recipe import Source

__all__ = ["WEBDATASET", "TarMember", "WdsSample", "scan_samples", "split_key"]

_BLOCK = 512
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_REGULAR = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE}


def split_key(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, as WebDataset groups members; None: no dot."""
    m = _KEY.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2).lower()


@dataclass(frozen=True)
class TarMember:
    offset: int  # the member's first header (extended headers included)
    name: str
    data: int  # where its data starts
    size: int


class _Tape:
    """A position in a tar stream: seeks when the file can, reads forward when it cannot."""

    def __init__(self, f: IO[bytes], pos: int, seekable: bool, uri: str) -> None:
        self.f, self.pos, self.seekable, self.uri = f, pos, seekable, uri
        if seekable:
            f.seek(pos)
        elif pos:
            self.skip_to(pos)

    def read(self, n: int) -> bytes:
        try:
            got = self.f.read(n)
        except Exception as e:
            _read_error(e, self.uri)
        self.pos += len(got)
        return got

    def skip_to(self, pos: int) -> None:
        if pos == self.pos:
            return
        if self.seekable:
            self.f.seek(pos)
            self.pos = pos
            return
        while self.pos < pos:
            if not self.read(min(pos - self.pos, 1 << 20)):
                raise DataError(f"{self.uri}: the tar ends at byte {self.pos}, inside a member "
                                f"(the file is truncated)")

    def read_at(self, pos: int, n: int) -> bytes:
        self.skip_to(pos)
        got = self.read(n)
        if len(got) < n:
            raise DataError(f"{self.uri}: the tar is truncated: a member's {n} bytes at byte "
                            f"{pos} are not all there")
        return got


_POSIX_MAGIC = b"ustar\x0000"


_OCTAL = re.compile(rb"[0-7]*")
_DECIMAL = re.compile(r"[0-9]+")


def _octal(field: bytes, what: str) -> int:
    """A header's number field; ValueError naming ``what`` unless a non-negative number."""
    if field[:1] == b"\x80":  # GNU base-256, positive (sizes beyond 8 GiB)
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    if field[:1] == b"\xff" or not _OCTAL.fullmatch(digits):
        raise ValueError(f"its {what} field {field!r} is no non-negative octal number")
    return int(digits, 8) if digits else 0


def _header(block: bytes) -> tuple[str, int, bytes]:
    """``(name, size, type)`` of a tar header block (what :class:`tarfile.TarInfo` takes
    from it, without the fields a reader of members does not need); ValueError if invalid."""
    stored = _octal(block[148:156], "checksum")
    total = int(np.frombuffer(block, np.uint8).sum()) - sum(block[148:156]) + 256
    if stored != total and stored != int(np.frombuffer(block, np.int8).sum()) - sum(
            b - 256 if b > 127 else b for b in block[148:156]) + 256:
        raise ValueError("bad checksum")  # (the second sum: old tars' signed checksums)
    name = block[:100].split(b"\0", 1)[0]
    kind = block[156:157]
    if block[257:265] == _POSIX_MAGIC:
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    text = name.decode("utf-8", "surrogateescape")
    if kind == tarfile.AREGTYPE and text.endswith("/"):
        kind = tarfile.DIRTYPE
    return text, _octal(block[124:136], "size"), kind


_PAX_RECORD = re.compile(rb"([0-9]{1,20}) ")


def _pax(records: bytes, uri: str, at: int) -> dict[str, str]:
    """The ``key=value`` records of a pax header (``LENGTH key=value\\n`` each, as POSIX
    writes them; NUL padding after the last is allowed); DataError if malformed."""
    out: dict[str, str] = {}
    pos = 0
    end = len(records.rstrip(b"\0"))
    while pos < end:
        m = _PAX_RECORD.match(records, pos)
        length = int(m.group(1)) if m else 0
        record = records[m.end():pos + length] if m else b""
        if m is None or pos + length > end or not record.endswith(b"\n") or b"=" not in record:
            raise DataError(f"{uri}: the pax header at byte {at} holds a malformed record at "
                            f"byte {pos} of its data: {records[pos:pos + 40]!r}")
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _pax_size(value: str, uri: str, at: int) -> int:
    if not _DECIMAL.fullmatch(value):
        raise DataError(f"{uri}: the pax header at byte {at} has the size field {value!r}, "
                        f"which is no non-negative decimal number")
    return int(value)


def _members(tape: _Tape, total: int | None) -> Iterator[TarMember]:
    """The regular-file members from the tape's position to the end-of-archive block.
    ``tape.pos`` is, after the generator ends, the offset of that block."""
    first: int | None = None
    name: str | None = None
    size_override: int | None = None
    while True:
        at = tape.pos
        header = tape.read(_BLOCK)
        if not header:
            raise DataError(f"{tape.uri}: the tar ends at byte {at} without its "
                            f"end-of-archive block (the file is truncated)")
        if len(header) < _BLOCK:
            raise DataError(f"{tape.uri}: the tar is truncated inside the header at byte {at}")
        if header == bytes(_BLOCK):
            tape.pos = at  # the end-of-archive block
            return
        try:
            header_name, size, kind = _header(header)
        except ValueError as e:
            raise DataError(f"{tape.uri}: no valid tar header at byte {at} ({e})") from e
        if size_override is not None and kind not in (tarfile.XHDTYPE,
                                                      tarfile.GNUTYPE_LONGNAME):
            size = size_override
        data = at + _BLOCK
        end = data + -(-size // _BLOCK) * _BLOCK
        if total is not None and data + size > total:
            raise DataError(f"{tape.uri}: the tar is truncated: member {header_name!r} at byte "
                            f"{at} needs {data + size} bytes, the file has {total}")
        if kind in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE) and size > MAX_RECORD_BYTES:
            raise DataError(f"{tape.uri}: the extended header at byte {at} claims {size} bytes "
                            f"in its size field, more than the {MAX_RECORD_BYTES} a header "
                            f"may hold")
        if kind == tarfile.GNUTYPE_LONGNAME:
            first = at if first is None else first
            name = tape.read_at(data, size).rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif kind == tarfile.XHDTYPE:
            first = at if first is None else first
            pax = _pax(tape.read_at(data, size), tape.uri, at)
            if "path" in pax:
                name = pax["path"]
            if "size" in pax:
                size_override = _pax_size(pax["size"], tape.uri, at)
        elif kind in (tarfile.GNUTYPE_LONGLINK, tarfile.XGLTYPE):
            first = at if first is None else first
        else:
            start = at if first is None else first
            member_name = name if name is not None else header_name
            first, name, size_override = None, None, None
            if kind in _REGULAR:
                yield TarMember(start, member_name, data, size)
        tape.skip_to(end)


def _open(sf: SourceFile, pos: int) -> tuple[IO[bytes], _Tape]:
    f = open_content(sf)
    return f, _Tape(f, pos, sf.compression is None, sf.uri)


def scan_samples(sf: SourceFile) -> tuple[np.ndarray, int]:
    """The byte offsets of every sample's first header, and of the end-of-archive block."""
    starts: list[int] = []
    key: str | None = None
    f, tape = _open(sf, 0)
    with f:
        for m in _members(tape, sf.size if sf.compression is None else None):
            got = split_key(m.name)
            if got is None:
                continue
            if got[0] != key:
                starts.append(m.offset)
                key = got[0]
        return np.array(starts, dtype=np.int64), tape.pos


@dataclass(frozen=True)
class WdsSample:
    """A raw record: the selected member's bytes (None: no such member, or one too large to
    read) and the sample's extensions, in member order. A reader of parts (a vision source)
    keeps every selected member: ``parts`` maps each extension read to its bytes (None: over
    ``MAX_RECORD_BYTES``, its size in ``sizes``)."""

    key: str
    data: bytes | None
    extensions: tuple[str, ...]
    duplicate: str | None = None
    oversize: int | None = None  # the selected member's size, when over MAX_RECORD_BYTES
    parts: dict[str, bytes | None] | None = None
    sizes: dict[str, int] | None = None


class WebDatasetReader:
    """Samples of one source's tars (the member whose extension is the source's field, or
    every member whose extension is one of ``wanted``)."""

    def __init__(self, files: list[SourceFile], field: str,
                 wanted: frozenset[str] | None = None) -> None:
        self._files = files
        self._ext = field.lower()
        self._wanted = wanted

    def _samples(self, file: int, pos: int, stop: int) -> Iterator[tuple[int, WdsSample]]:
        """Samples starting at ``pos`` (a sample boundary) before byte ``stop`` (-1: all)."""
        sf = self._files[file]
        wanted = self._wanted
        f, tape = _open(sf, pos)
        with f:
            key: str | None = None
            start = pos
            data: bytes | None = None
            exts: list[str] = []
            dup: str | None = None
            over: int | None = None
            parts: dict[str, bytes | None] = {}
            sizes: dict[str, int] = {}

            def sample() -> WdsSample:
                assert key is not None
                if wanted is None:
                    return WdsSample(key, data, tuple(exts), dup, over)
                return WdsSample(key, None, tuple(exts), dup, None, parts, sizes)

            for m in _members(tape, sf.size if sf.compression is None else None):
                got = split_key(m.name)
                if got is None:
                    continue
                if got[0] != key:
                    if key is not None:
                        yield start, sample()
                    if 0 <= stop <= m.offset:
                        return
                    key, start, data, exts, dup, over = got[0], m.offset, None, [], None, None
                    parts, sizes = {}, {}
                ext = got[1]
                if ext in exts and dup is None:
                    dup = ext
                if wanted is not None:
                    if ext in wanted and ext not in exts:
                        sizes[ext] = m.size
                        parts[ext] = (None if m.size > MAX_RECORD_BYTES
                                      else tape.read_at(m.data, m.size))
                elif ext == self._ext and ext not in exts:
                    if m.size > MAX_RECORD_BYTES:
                        over = m.size  # never read: the walk seeks (or streams) past it
                    else:
                        data = tape.read_at(m.data, m.size)
                exts.append(ext)
            if key is not None:
                yield start, sample()

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        return self._samples(chunk.file, chunk.start if start is None else start, chunk.stop)

    def read_one(self, ref: Ref) -> Any:
        file, pos = ref
        for _, sample in self._samples(file, pos, pos + 1):
            return sample
        raise StorageError(f"{self._files[file].uri} has no sample at byte {pos}")

    def fields(self, file: int) -> list[str]:
        """The extensions of the file's first 100 samples, in the order first seen."""
        seen: dict[str, None] = {}
        for k, (_, sample) in enumerate(self._samples(file, 0, -1)):
            seen.update(dict.fromkeys(sample.extensions))
            if k >= 100:
                break
        return list(seen)

    def close(self) -> None:
        pass


class WebDataset(FormatBase):
    """WebDataset tars; :meth:`for_source` configures a copy that reads a kind's parts."""

    name = "webdataset"
    unit = "byte"
    bad_reasons = frozenset({"missing_field", "malformed_sample", "malformed_json", TOO_LARGE})

    def __init__(self, parts: dict[str, tuple[str, ...]] | None = None) -> None:
        self._parts = parts

    def for_source(self, source: Source) -> WebDataset:
        parts = getattr(source.kind_config, "document_parts", None)
        return WebDataset(dict(parts)) if parts else self

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        if sf.compression is not None:
            return [Chunk(index, 0, -1)] if sf.size > 0 else []
        starts, end = scan_samples(sf)
        n = len(starts)
        if n == 0:
            return []
        if chunk_rows is not None:
            firsts = list(range(0, n, chunk_rows))
        else:  # a sample belongs to the chunk_bytes range its first header lies in
            firsts = [0, *(int(c) for c in np.flatnonzero(np.diff(starts // chunk_bytes)) + 1)]
        bounds = [int(starts[i]) for i in firsts] + [end]
        return [Chunk(index, a, b) for a, b in itertools.pairwise(bounds)]

    def reader(self, files: list[SourceFile], field: str) -> WebDatasetReader:
        if self._parts is None:
            return WebDatasetReader(files, field)
        wanted = frozenset(e for exts in self._parts.values() for e in exts)
        return WebDatasetReader(files, field, wanted)

    def decode(self, raw: Any, field: str) -> Decoded:
        sample: WdsSample = raw
        if sample.duplicate is not None:
            return None, "malformed_sample", (f"sample {sample.key!r} has two members with the "
                                              f"extension {sample.duplicate!r}")
        if self._parts is not None:
            return self._decode_parts(sample)
        if sample.oversize is not None:
            return None, TOO_LARGE, (f"sample {sample.key!r}: its .{field.lower()} member holds "
                                     f"{sample.oversize} bytes, more than the "
                                     f"{MAX_RECORD_BYTES} a record may hold")
        if sample.data is None:
            return None, "missing_field", (f"sample {sample.key!r} has no .{field.lower()} "
                                           f"member")
        return self._value(sample.data, field.lower())

    def _decode_parts(self, sample: WdsSample) -> Decoded:
        """``{part: value}``: for each part, the bytes of the one member holding it (parsed
        when its extension ends in ``json``)."""
        assert self._parts is not None
        found = sample.parts or {}
        out: dict[str, Any] = {}
        for part, exts in self._parts.items():
            present = [e for e in exts if e in found]
            names = ", ".join(f".{e}" for e in exts)
            if not present:
                return None, "missing_field", (f"sample {sample.key!r} has no {part} member "
                                               f"({names})")
            if len(present) > 1:
                return None, "malformed_sample", (
                    f"sample {sample.key!r} has {len(present)} {part} members "
                    f"({', '.join(f'.{e}' for e in present)}); it may hold one")
            ext = present[0]
            data = found[ext]
            if data is None:
                size = (sample.sizes or {}).get(ext, 0)
                return None, TOO_LARGE, (f"sample {sample.key!r}: its .{ext} member holds "
                                         f"{size} bytes, more than the {MAX_RECORD_BYTES} a "
                                         f"record may hold")
            value, reason, detail = self._value(data, ext)
            if reason is not None:
                return None, reason, f"sample {sample.key!r}, .{ext}: {detail}"
            out[part] = value
        return out, None, None

    @staticmethod
    def _value(data: bytes, ext: str) -> Decoded:
        """A member's value: its bytes, or parsed JSON for an extension ending in ``json``."""
        if not ext.endswith("json"):
            return data, None, None
        try:
            return json.loads(data), None, None
        except UnicodeDecodeError as e:
            return None, "malformed_json", f"invalid UTF-8 at byte {e.start} of the JSON member"
        except RecursionError:
            return None, "malformed_json", "JSON nested deeper than the parser's limit"
        except ValueError as e:
            return None, "malformed_json", f"JSON the parser refuses: {e}"

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        if all(f.compression is not None for f in files if f.format == self.name):
            return "compressed tars are one chunk each: use uncompressed tars or more shards"
        return f"set a smaller {where}.chunk_bytes or {where}.chunk_rows (samples per chunk)"


WEBDATASET = WebDataset()


def _read_error(e: Exception, uri: str) -> NoReturn:
    from datalane.engine.formats.jsonl import _raise_read_error

    _raise_read_error(e, uri)

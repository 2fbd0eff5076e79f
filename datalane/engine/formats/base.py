"""The source-format seam: how a kind of file is cut into chunks and read as records.

A :class:`Format` cuts one file into :class:`Chunk` s (the unit dealt
to lanes), opens a :class:`FormatReader` over a source's files that yields each record of a
chunk with its *position* (the format's own record address: a byte offset, a row, a document
index), and decodes a raw record into the value of the source's field on worker threads. A
document's reference is ``(file index, position)``: enough to read it again alone
(:meth:`FormatReader.read_one`), which is how a packer's carry-over is restored.

A format is declared once, in :data:`datalane.spec.formats.DECLARED` (its name, extensions,
whether its records are token ids, whether a directory holds its datasets, where its
implementation lives); :mod:`datalane.engine.formats` loads each declared implementation, a
subclass of :class:`FormatBase` whose optional hooks (:meth:`~FormatBase.for_source`,
:meth:`~FormatBase.list_directory`, :meth:`~FormatBase.lists`) default to "none". Adding a
format is its module plus that one declaration; tests/engine/test_format_contract.py runs
every declared format through the same contract with the fixture writer
tests/support/formats.py registers for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from datalane.engine.files import SourceFile
    from datalane.spec.recipe import Source

__all__ = ["MISSING", "Chunk", "Decoded", "Format", "FormatBase", "FormatReader", "Listed",
           "Ref", "TooLarge"]

MISSING = object()  # a record without the source's field (a Parquet file without the column)


@dataclass(frozen=True)
class TooLarge:
    """The raw value of a record over :data:`~datalane.spec.limits.MAX_RECORD_BYTES`, which its
    reader did not hold: the map stage sets it aside as a bad record of reason ``too_large``
    (:mod:`datalane.engine.mapstage`), whatever the format. ``size``: its bytes, or at least
    that many when the reader stopped counting."""

    size: int
    what: str = "record"  # what the format calls it: "line", "document", "value"

    @property
    def detail(self) -> str:
        from datalane.spec.limits import MAX_RECORD_BYTES

        return (f"a {self.what} of {self.size:,} bytes, over the limit of "
                f"{MAX_RECORD_BYTES:,} bytes per record")


@dataclass(frozen=True)
class Chunk:
    """A piece of one file, in the format's own units: byte range ``[start, stop)`` (JSONL;
    stop -1 is "to the end") or row range ``[start, stop)`` (Parquet)."""

    file: int
    start: int
    stop: int


Listed = list[tuple[str, int, str]]
"""What a dataset directory holds, as ``(filesystem path, size, ident)`` source files."""

Ref = tuple[int, ...]
"""A document's reference: the index of its file in its source first (which format reads it),
then what the format needs to read the record again alone (:meth:`FormatReader.read_one`); a
format's own :meth:`Format.ref` builds it and :meth:`Format.position` reads it back."""

Decoded = tuple[Any, str | None, str | None]
"""``(value, None, None)``, or ``(None, reason, detail)`` for a record that has no value."""


class FormatReader(Protocol):
    """Reads raw records of one source's files of this format; one per lane and source."""

    def records(self, chunk: Chunk, start: int | None = None) -> Iterator[tuple[int, Any]]:
        """``(position, raw)`` of each record of ``chunk``, from position ``start`` if given."""
        ...

    def read_one(self, ref: Ref) -> Any:
        """The raw record a document reference names (:meth:`Format.ref`)."""
        ...

    def fields(self, file: int) -> list[str]:
        """The field names the records of file ``file`` have (for errors naming them)."""
        ...

    def close(self) -> None: ...


class Format(Protocol):
    """One file format."""

    name: str
    unit: str  # what a position counts ("byte", "row"), for error messages
    bad_reasons: frozenset[str]  # reasons decode() returns that are bad records
    #: whether :meth:`decode` returns a raw record that is a numpy array as it is (token
    #: files, Parquet integer lists): a map task whose raw records are all arrays then skips
    #: decoding them one by one
    passes_arrays: bool

    def cut(self, index: int, sf: SourceFile, chunk_bytes: int,
            chunk_rows: int | None) -> list[Chunk]:
        """The chunks of file number ``index``, in file order."""
        ...

    def reader(self, files: list[SourceFile], field: str) -> FormatReader: ...

    def decode(self, raw: Any, field: str) -> Decoded:
        """The field's value in one raw record (thread-safe)."""
        ...

    def fewer_chunks_hint(self, files: list[SourceFile], where: str) -> str:
        """What to change when a source has fewer chunks than lanes."""
        ...

    def ref(self, file: int, pos: int) -> Ref:
        """The reference of the record at position ``pos`` of file ``file``."""
        ...

    def position(self, ref: Ref) -> int | None:
        """The record position ``ref`` names, or None when it is no reference of this format
        (a lane state naming a document the recipe cannot hold)."""
        ...

    def for_source(self, source: Source) -> Format:
        """The format as ``source`` reads it (flatbin: the token width and the boundary id),
        or ConfigError when the source cannot read it at all (token files in a text source)."""
        ...

    def list_directory(self, fs: Any, path: str) -> Listed | None:
        """The source files of the dataset directory ``path``, or None when it holds none of
        this format (a format declared with a ``directory`` implements it)."""
        ...

    def lists(self, ident: str) -> bool:
        """Whether a listed entry of identity ``ident`` is a dataset of this format that no
        extension names (a Lance table listed as one source file)."""
        ...


class FormatBase:
    """The defaults of :class:`Format`'s optional hooks: the same reading for every source,
    no dataset directory."""

    name: str
    unit: str
    bad_reasons: frozenset[str]
    passes_arrays: bool = False

    def ref(self, file: int, pos: int) -> Ref:
        return (file, pos)

    def position(self, ref: Ref) -> int | None:
        return ref[1] if len(ref) == 2 and ref[1] >= 0 else None

    def for_source(self, source: Source) -> Format:
        return self  # type: ignore[return-value]

    def list_directory(self, fs: Any, path: str) -> Listed | None:
        return None

    def lists(self, ident: str) -> bool:
        return False

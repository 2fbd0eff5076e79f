"""A JSON file holding one array of records (LLaVA-Instruct's ``llava_instruct_150k.json``),
read an element at a time in bounded memory.

Such a file is often one line of hundreds of megabytes, so it cannot be read as JSONL, and
parsing it whole would hold all of it (and its Python objects) at once. :class:`ArrayScan`
finds the array's elements by scanning its bytes for the JSON structure only - brackets,
braces, commas at the array's own level, and strings (whose contents, escapes included, are
skipped) - carrying its state from one read to the next, so a file is read in pieces of
:data:`READ` bytes and never held whole. An element is the bytes between two of the array's
commas (or its brackets), whitespace stripped; its *position* is the offset of its first byte
in the file, as a JSONL record's is. Each element is then parsed alone, as a JSONL line is
(bad JSON inside an element is a bad record of that element only); an element over
:data:`~datalane.spec.limits.MAX_RECORD_BYTES` is scanned to its end without being kept
(:class:`~datalane.engine.formats.base.TooLarge`).

Chunks: :func:`array_chunks` scans the file once when the plan is made (reading all of it; a
remote file is downloaded once for it) and cuts it at the first element at or after each
multiple of ``chunk_bytes``; a chunk ``[start, stop)`` owns the elements whose position lies
in it, and reading it starts at ``start``, an element's first byte, at the array's level and
outside any string, so no chunk needs a byte before it. What the scan cannot place - a file
that ends inside the array, bytes after its closing bracket, a bracket closing more than was
opened - raises a :class:`~datalane.spec.errors.DataError` naming the file and the byte. Only
uncompressed files are read as arrays (a compressed stream cannot be entered at a chunk's
byte); callers: :mod:`datalane.engine.formats.llavajson`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

from datalane.engine.formats.base import Chunk, TooLarge
from datalane.spec.errors import DataError
from datalane.spec.limits import MAX_RECORD_BYTES

__all__ = ["READ", "ArrayScan", "array_chunks", "array_start", "elements"]

READ = 1 << 20  # bytes read at a time
_WHITESPACE = b" \t\r\n"
_OUTSIDE = re.compile(rb'[\[\]{},"]')  # what matters outside a string
_INSIDE = re.compile(rb'["\\]')  # what ends a string, or escapes the next byte

Element = tuple[int, "bytes | TooLarge"]


class ArrayScan:
    """The state of a scan of an array's bytes, fed in pieces (:meth:`feed`). It starts at
    the array's level (just after ``[``, or at an element's first byte), outside a string."""

    def __init__(self, at: int, uri: str, after_bracket: bool) -> None:
        self.uri = uri
        self.at = at  # file offset of the next byte fed
        self.depth = 1  # 1: the array's own level; 0: after its closing bracket
        self.in_string = False
        self.escaped = False  # the previous piece ended on a backslash inside a string
        self.after_bracket = after_bracket  # nothing of the array seen yet (an empty [])
        self.closed: int | None = None  # offset of the closing bracket, once seen
        self._pieces: list[bytes] | None = []  # the current element's bytes; None: too large
        self._size = 0
        self._first: int | None = None  # offset of the current element's first byte

    def _add(self, piece: bytes, offset: int) -> None:
        """Bytes of the current element (between separators)."""
        if self._first is None:
            lead = len(piece) - len(piece.lstrip(_WHITESPACE))
            if lead < len(piece):
                self._first = offset + lead
                piece = piece[lead:]
            else:
                return
        self._size += len(piece)
        if self._pieces is not None:
            if self._size > MAX_RECORD_BYTES:
                self._pieces = None
            else:
                self._pieces.append(piece)

    def _element(self, at: int) -> Element | None:
        """The element that a separator at file offset ``at`` ends, or None for none (an
        empty array)."""
        pieces, first = self._pieces, self._first
        self._pieces, self._first = [], None
        if first is None:  # an empty element: "[]" has none, "[1,,2]" and "[1,]" one
            size, self._size = 0, 0
            if self.after_bracket and self.closed is not None:
                return None
            return at, b""
        data = b"".join(pieces).rstrip(_WHITESPACE) if pieces is not None else None
        size, self._size = self._size, 0
        if data is None:
            return first, TooLarge(size, "array element")
        return first, data

    def feed(self, buf: bytes) -> list[Element]:
        """The elements that ``buf`` (the next bytes of the file) completes."""
        out: list[Element] = []
        base = self.at
        n = len(buf)
        pos = 0
        start = 0  # of the part of buf not yet given to the current element
        if self.closed is not None:
            self._after_close(buf, base)
            self.at += n
            return out
        if self.escaped and n:
            pos, self.escaped = 1, False
        while pos < n:
            if self.in_string:
                m = _INSIDE.search(buf, pos)
                if m is None:
                    pos = n
                    break
                if m.group() == b"\\":
                    if m.end() >= n:
                        self.escaped = True
                        pos = n
                        break
                    pos = m.end() + 1
                    continue
                self.in_string = False
                pos = m.end()
                continue
            m = _OUTSIDE.search(buf, pos)
            if m is None:
                pos = n
                break
            c = m.group()
            pos = m.end()
            if c == b'"':
                self.in_string = True
            elif c in b"[{":
                self.depth += 1
            elif c in b"]}":
                self.depth -= 1
                if self.depth == 0:
                    if c != b"]":
                        raise DataError(f"{self.uri}: the JSON array is closed by '}}' at byte "
                                        f"{base + m.start()}")
                    self._add(buf[start:m.start()], base + start)
                    self.closed = base + m.start()
                    got = self._element(self.closed)
                    if got is not None:
                        out.append(got)
                    self._after_close(buf[pos:], base + pos)
                    self.at += n
                    return out
            elif self.depth == 1:  # a comma between two elements
                self._add(buf[start:m.start()], base + start)
                got = self._element(base + m.start())
                assert got is not None
                out.append(got)
                self.after_bracket = False
                start = pos
        self._add(buf[start:n], base + start)
        self.at += n
        return out

    def _after_close(self, rest: bytes, at: int) -> None:
        extra = len(rest) - len(rest.lstrip(_WHITESPACE))
        if extra < len(rest):
            raise DataError(f"{self.uri}: bytes after the JSON array's closing bracket (at "
                            f"byte {self.closed}), at byte {at + extra}: a file of one JSON "
                            f"array holds nothing after it")

    def ended(self, size_hint: int) -> None:
        """The file ended: raise unless the array was closed."""
        if self.closed is None:
            raise DataError(f"{self.uri}: the file ends at byte {size_hint} inside its JSON "
                            f"array (no closing bracket): truncated or not one JSON array")


def array_start(f: Any, uri: str) -> int | None:
    """The offset just after the ``[`` opening a file read from its start (``f`` is left past
    it), or None when its first byte that is not whitespace (or a UTF-8 byte order mark) is
    another one (JSONL)."""
    offset = 0
    head = f.read(3)
    if head.startswith(b"\xef\xbb\xbf"):
        offset, head = 3, b""
    while True:
        if not head:
            head = f.read(READ)
            if not head:
                return None
        lead = len(head) - len(head.lstrip(_WHITESPACE))
        offset += lead
        if lead < len(head):
            return offset + 1 if head[lead:lead + 1] == b"[" else None
        head = b""


def elements(f: Any, at: int, stop: int, uri: str, after_bracket: bool) -> Iterator[Element]:
    """The elements of an array read from ``f``, positioned at file offset ``at`` (an element's
    first byte, or just after ``[``: ``after_bracket``), whose position is before ``stop``
    (-1: to the end); raises DataError for a file that is no complete array."""
    scan = ArrayScan(at, uri, after_bracket)
    while True:
        buf = f.read(READ)
        if not buf:
            scan.ended(scan.at)
            return
        for pos, data in scan.feed(buf):
            if 0 <= stop <= pos:
                return
            yield pos, data
        if scan.closed is not None:
            return


def array_chunks(index: int, f: Any, uri: str, chunk_bytes: int) -> list[Chunk]:
    """The chunks of file number ``index`` (an array: :func:`array_start` said so), read from
    its start: the first starts just after ``[``, the next ones at the first element at or
    after each multiple of ``chunk_bytes`` (never an empty one: ``[1,,2]``'s is at the comma
    ending it); the last ends just after the closing bracket."""
    begin = array_start(f, uri)
    if begin is None:
        raise DataError(f"{uri}: not a JSON array")
    f.seek(begin)
    starts = [begin]
    seen = 0  # elements: the first is the first chunk's, never an empty chunk before it
    scan = ArrayScan(begin, uri, True)
    while scan.closed is None:
        buf = f.read(READ)
        if not buf:
            scan.ended(scan.at)
        for pos, data in scan.feed(buf):
            if data != b"" and pos >= (starts[-1] // chunk_bytes + 1) * chunk_bytes and seen:
                starts.append(pos)
            seen += 1
    while buf := f.read(READ):  # only whitespace may follow the array, to the file's end
        scan.feed(buf)
    assert scan.closed is not None
    bounds = [*starts, scan.closed + 1]
    return [Chunk(index, a, b) for a, b in itertools.pairwise(bounds)]

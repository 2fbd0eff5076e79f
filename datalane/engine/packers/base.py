"""The packer seam: documents become sequences of ``size`` tokens (docs/architecture.md, One lane).

A packer pulls documents (:class:`~datalane.engine.documents.base.Doc`) from the mixture and
emits one sequence per call as the recipe's columns: document columns (``input_ids``, a chat
``loss_mask``) copied from the pieces it placed, ``positions`` counting 0.. within each piece
(a document continued from an earlier sequence starts again at 0), pad values (positions -1)
after the last piece. Its carry-over between sequences is a set of :class:`Piece` s, token
ranges of documents named by reference, never tokens; :meth:`Packer.state` returns it as JSON
nested under the packer's name in the lane state, and a packer built with that state re-reads
the pieces (``fetch``) and continues exactly. A packer is declared once, in
:data:`datalane.spec.packing.DECLARED`, and :mod:`datalane.engine.packers` loads the class
its declaration names (a :class:`PackerBase`, whose optional hook :meth:`~Packer.fill_window`
is off by default); tests/engine/test_packer_contract.py runs every declared packer through
the same contract.

A document may carry :class:`~datalane.engine.documents.base.Attached` values (vision: its
image's patches), each at a token offset of the document. A packer carries them opaquely with
each piece it holds (the third item of :data:`Held`, offsets still relative to the document);
:func:`assemble`, which lays pieces out in a sequence, places the attachments whose token the
sequence holds at their offset in it and leaves them in :attr:`PackContext.placed` for the lane.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from datalane.engine.documents.base import Attached, Doc, Run
from datalane.spec.errors import MismatchError
from datalane.spec.recipe import Packing
from datalane.spec.schema import SampleSchema
from datalane.spec.state import Counters, PackerState, Piece

__all__ = ["Held", "PackContext", "Packer", "PackerBase", "Placed", "assemble", "decode_pieces",
           "positions_of", "take"]

#: a piece, its document columns, and its document's attachments (offsets in the document)
Held = tuple[Piece, tuple[np.ndarray, ...], tuple[Attached, ...]]
#: an attachment placed in a sequence: (token offset in the sequence, value)
Placed = tuple[int, Any]


@dataclass
class PackContext:
    """What a packer works with; the same for every packer."""

    next_doc: Callable[[], Doc | None]  # the mixture
    fetch: Callable[[int, tuple[int, ...]], Doc]  # re-read (source, ref) on restore
    size: int  # tokens per sequence (seq_len + 1)
    schema: SampleSchema
    counters: Counters
    options: Packing
    where: str = "lane state"  # prefix of restore errors
    next_run: Callable[[int], Run | None] | None = None  # the mixture, in bulk (fill_window)
    #: the attachments of the sequence :func:`assemble` built last, in token order (the lane
    #: takes them after each sequence)
    placed: list[Placed] = field(default_factory=list)
    _cache: dict[tuple[int, tuple[int, ...]], Doc] = field(default_factory=dict, repr=False)

    def held(self, piece: Piece) -> Held:
        """A carried piece with its columns, re-read by reference (each document once)."""
        key = (piece.source, piece.ref)
        doc = self._cache.get(key)
        if doc is None:
            doc = self._cache[key] = self.fetch(piece.source, piece.ref)
        if piece.stop > len(doc):
            raise MismatchError(f"{self.where}: carried piece {piece.encode()} ends after its "
                                f"document's {len(doc)} tokens")
        return piece, doc.slice(piece.start, piece.stop), doc.attached

    def done_restoring(self) -> None:
        self._cache.clear()


class Packer(Protocol):
    """One packing algorithm."""

    name: ClassVar[str]

    def __init__(self, ctx: PackContext, state: PackerState | None = None) -> None: ...

    def next_sequence(self) -> dict[str, np.ndarray] | None:
        """The next sequence's columns, or None when no document is left and none is held."""
        ...

    def state(self) -> dict[str, Any]:
        """The carry-over as JSON (call between sequences)."""
        ...

    #: whether :meth:`fill_window` fills whole windows (the lane then calls it instead of
    #: :meth:`next_sequence` when every column of the recipe is per token)
    fills_windows: ClassVar[bool]

    def fill_window(self, columns: dict[str, np.ndarray], rows: int) -> int:
        """Fill ``rows`` sequences of ``columns`` in place, as that many calls of
        :meth:`next_sequence` would (pad rows after the last document); the rows filled with
        tokens (fewer than ``rows``: no document is left)."""
        ...


class PackerBase:
    """The defaults of :class:`Packer`'s optional hooks: sequences one at a time."""

    name: ClassVar[str]
    fills_windows: ClassVar[bool] = False

    def fill_window(self, columns: dict[str, np.ndarray], rows: int) -> int:
        raise NotImplementedError(f"packer {self.name!r} does not fill whole windows")


def take(ctx: PackContext) -> Held | None:
    """The mixture's next document as one whole piece (counted as kept), or None."""
    doc = ctx.next_doc()
    if doc is None:
        return None
    ctx.counters.kept += 1
    return Piece(doc.source, doc.ref, 0, len(doc)), doc.columns, doc.attached


ARANGE = np.arange((1 << 20) + 1, dtype=np.int32)  # positions 0.. of a piece (seq_len <= 2^20)


def positions_of(n: int) -> np.ndarray:
    """Positions ``0..n-1`` of a piece: a view of :data:`ARANGE` when it is long enough, else
    a new array. A carried piece can be longer than any sequence (a document spanning several
    windows), and a short view would leave the rest of its positions unwritten."""
    return ARANGE[:n] if n <= len(ARANGE) else np.arange(n, dtype=np.int32)


def assemble(pieces: list[Held], ctx: PackContext) -> dict[str, np.ndarray]:
    """One sequence from ``pieces`` in order, padded to ``ctx.size``; counts tokens and sets
    ``ctx.placed`` to the attachments whose token the sequence holds, at their offset in it."""
    size = ctx.size
    out: dict[str, np.ndarray] = {}
    at = 0
    doc_index = 0
    for c in ctx.schema:
        if c.per_image:  # built by the lane from ctx.placed
            continue
        a = np.full(size, c.pad, dtype=c.np_dtype)
        at = 0
        if c.fill == "position":
            for _, cols, _ in pieces:
                n = len(cols[0])
                a[at:at + n] = positions_of(n)
                at += n
        else:
            for _, cols, _ in pieces:
                n = len(cols[0])
                a[at:at + n] = cols[doc_index]
                at += n
            doc_index += 1
        out[c.name] = a
    placed: list[Placed] = []
    start = 0
    for piece, cols, attached in pieces:
        for item in attached:
            if piece.start <= item.offset < piece.stop:
                placed.append((start + item.offset - piece.start, item.value))
        start += len(cols[0])
    ctx.placed = placed
    ctx.counters.tokens += at
    ctx.counters.padding += size - at
    return out


def check_packer(state: PackerState | None, name: str, where: str) -> Mapping[str, Any] | None:
    """The state's JSON if it is ``name``'s (None: fresh); MismatchError for another packer's."""
    if state is None:
        return None
    if state.name is not None and state.name != name:
        raise MismatchError(f"{where} was packed by {state.name!r}; the recipe packs with "
                            f"{name!r}")
    return state.data


def decode_pieces(data: Any, where: str) -> list[Piece]:
    if not isinstance(data, list):
        raise MismatchError(f"{where} must be a list of pieces, got {type(data).__name__}")
    return [Piece.decode(p, f"{where}[{i}]") for i, p in enumerate(data)]

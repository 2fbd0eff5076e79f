"""``wrap``: concatenate documents and cut; a document may continue into the next sequence.

The carry-over between sequences is at most the tail of one document: ``{"held": [piece]}``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from datalane.engine.documents.base import Attached, Run
from datalane.engine.packers.base import (
    ARANGE,
    Held,
    PackContext,
    PackerBase,
    assemble,
    check_packer,
    decode_pieces,
    take,
)
from datalane.spec.errors import MismatchError
from datalane.spec.state import PackerState, Piece

__all__ = ["WrapPacker"]


class WrapPacker(PackerBase):
    name: ClassVar[str] = "wrap"
    fills_windows: ClassVar[bool] = True

    def __init__(self, ctx: PackContext, state: PackerState | None = None) -> None:
        self.ctx = ctx
        self._held: list[Held] = []
        # each column of a window: (name, its index among the document columns or -1 for the
        # positions, pad value)
        self._columns: list[tuple[str, int, int]] = []
        doc_index = 0
        for c in ctx.schema:
            self._columns.append((c.name, -1 if c.fill == "position" else doc_index, c.pad))
            doc_index += c.fill != "position"
        data = check_packer(state, self.name, ctx.where)
        if data is None:
            return
        where = f"{ctx.where}.pack.{self.name}"
        if state is not None and state.name is None:  # a version-1 carry-over
            if data.get("pending") is not None:
                raise MismatchError(f"{ctx.where} has a pending piece, which only 'bestfit' "
                                    f"packing keeps; the recipe packs with 'wrap'")
            groups = data.get("carry", [])
            if len(groups) > 1:
                raise MismatchError(f"{ctx.where}: the packer's carry-over has {len(groups)} "
                                    f"open sequences; the recipe's packing keeps at most 1")
            pieces = decode_pieces(groups[0] if groups else [], where)
        else:
            extra = sorted(set(data) - {"held"})
            if extra:
                raise MismatchError(f"{where} has unknown keys {extra}")
            pieces = decode_pieces(data.get("held", []), f"{where}.held")
        if sum(p.tokens for p in pieces[:-1]) > ctx.size:
            raise MismatchError(
                f"{ctx.where}: open sequence 0 of the packer's carry-over holds {len(pieces)} "
                f"pieces of "
                f"{sum(p.tokens for p in pieces)} tokens, more than a sequence of {ctx.size} "
                f"tokens can hold; the state is damaged")
        self._held = [ctx.held(p) for p in pieces]
        ctx.done_restoring()

    def next_sequence(self) -> dict[str, Any] | None:
        size = self.ctx.size
        have = sum(len(cols[0]) for _, cols, _ in self._held)
        while have < size:
            got = take(self.ctx)
            if got is None:
                break
            self._held.append(got)
            have += len(got[1][0])
        if have == 0:
            return None
        out: list[Held] = []
        room = size
        while self._held and room:
            piece, cols, attached = self._held[0]
            if len(cols[0]) <= room:
                out.append(self._held.pop(0))
                room -= len(cols[0])
            else:
                cut = piece.start + room
                out.append((Piece(piece.source, piece.ref, piece.start, cut),
                            tuple(c[:room] for c in cols), attached))
                self._held[0] = (Piece(piece.source, piece.ref, cut, piece.stop),
                                 tuple(c[room:] for c in cols), attached)
                room = 0
        return assemble(out, self.ctx)

    def fill_window(self, columns: dict[str, np.ndarray], rows: int) -> int:
        """Fill ``columns`` (``rows`` sequences each) as ``rows`` calls of
        :meth:`next_sequence` would, documents taken in runs; rows past the data are padding.
        Returns the rows that hold data (fewer than ``rows``: no document is left).

        The ordered thread runs this for every window: the document columns are copied in
        whole parts (a carried piece, runs of documents), the positions written once per
        piece of a document in a row."""
        ctx = self.ctx
        size = ctx.size
        total = rows * size
        # parts in order: (document columns, where its documents start in it or None for a
        # carried piece)
        parts: list[tuple[tuple[np.ndarray, ...], Sequence[int] | None]] = []
        have = 0
        for _, cols, _ in self._held:
            parts.append((cols, None))
            have += len(cols[0])
        last: Held | Run | None = self._held[-1] if self._held else None
        next_run = ctx.next_run
        assert next_run is not None
        while have < total:
            run = next_run(total - have)
            if run is None:
                break
            ctx.counters.kept += run.docs
            parts.append((run.columns, run.offsets))
            have += len(run.columns[0])
            last = run
        used = min(have, total)
        self._held = []
        if have > total:  # the last part's tail is carried into the next window
            cols = parts[-1][0]
            tail = have - total
            n = len(cols[0])
            if isinstance(last, Run):
                length = last.offsets[-1] - last.offsets[-2]
                piece = Piece(last.source, last.last_ref, length - tail, length)
                attached: tuple[Attached, ...] = ()  # runs carry no attachments
            else:
                assert last is not None
                held, _, attached = last
                piece = Piece(held.source, held.ref, held.stop - tail, held.stop)
            self._held.append((piece, tuple(c[n - tail:] for c in cols), attached))
        for name, doc_index, pad in self._columns:
            flat = columns[name].reshape(-1)
            if doc_index < 0:
                _write_positions(flat, parts, used, size)
            else:
                at = 0
                for cols, _ in parts:
                    src = cols[doc_index]
                    n = len(src)
                    if at + n >= used:  # the last part in the window (its tail carried)
                        flat[at:used] = src[:used - at]
                        break
                    flat[at:at + n] = src
                    at += n
            if used < total:
                flat[used:] = pad
        ctx.counters.tokens += used
        ctx.counters.padding += total - used
        return -(-used // size)

    def state(self) -> dict[str, Any]:
        return {"held": [p.encode() for p, _, _ in self._held]}


_COUNT = ARANGE.data  # 0, 1, 2, ...: every piece's positions


def _write_positions(flat: np.ndarray, parts: list[Any], used: int, size: int) -> None:
    """The positions of a window's first ``used`` tokens: each piece of a document in a row
    counts from 0 (a part starts a document or continues a carried one; a row boundary
    restarts the count of the document crossing it). A piece is at most a row: :data:`ARANGE`
    holds its count. The column is int32, as :data:`ARANGE` (the schema's ``positions``)."""
    cuts = set(range(0, used, size))
    at = 0
    for cols, starts in parts:
        if starts is None:
            cuts.add(at)
        else:
            cuts.update([at + s for s in starts[:-1]])
        at += len(cols[0])
    edges = sorted(cuts)  # (every document of the window starts before its end)
    edges.append(used)
    # copied as bytes: numpy would give the GIL up for every piece of 500 tokens or more and
    # wait for it again behind the map workers, for a copy of a microsecond
    into = flat.data
    for lo, hi in itertools.pairwise(edges):
        into[lo:hi] = _COUNT[:hi - lo]

PACKER = WrapPacker

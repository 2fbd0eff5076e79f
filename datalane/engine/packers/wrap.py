"""``wrap``: concatenate documents and cut; a document may continue into the next sequence.

The carry-over between sequences is at most the tail of one document: ``{"held": [piece]}``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from datalane.engine.documents.base import Attached, Run
from datalane.engine.packers.base import (
    Held,
    PackContext,
    PackerBase,
    assemble,
    check_packer,
    decode_pieces,
    positions_of,
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

        The ordered thread runs this for every window: it works on whole parts (a carried
        piece, runs of documents), a few numpy copies each, never per document."""
        ctx = self.ctx
        size = ctx.size
        total = rows * size
        # parts in order: (document columns, positions, where its documents start in it or
        # None for a carried piece)
        parts: list[tuple[tuple[np.ndarray, ...], np.ndarray, Sequence[int] | None]] = []
        have = 0
        for _, cols, _ in self._held:
            n = len(cols[0])
            parts.append((cols, positions_of(n), None))
            have += n
        last: Held | Run | None = self._held[-1] if self._held else None
        next_run = ctx.next_run
        assert next_run is not None
        while have < total:
            run = next_run(total - have)
            if run is None:
                break
            ctx.counters.kept += run.docs
            parts.append((run.columns, run.positions, run.offsets))
            have += len(run.positions)
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
            at = 0
            for cols, positions, _ in parts:
                src = positions if doc_index < 0 else cols[doc_index]
                n = len(src)
                if at + n >= used:  # the last part in the window (its tail carried)
                    flat[at:used] = src[:used - at]
                    break
                flat[at:at + n] = src
                at += n
            if doc_index < 0 and used > size:
                self._restart_rows(flat, parts, used, size)
            if used < total:
                flat[used:] = pad
        ctx.counters.tokens += used
        ctx.counters.padding += total - used
        return -(-used // size)

    @staticmethod
    def _restart_rows(flat: np.ndarray, parts: list[Any], used: int, size: int) -> None:
        """Positions restart at every sequence: a document crossing a row boundary counts
        from 0 again after it, up to its end (or the row's)."""
        at = 0
        row = size
        for cols, _, starts in parts:
            n = len(cols[0])
            end_part = at + n
            while row < end_part and row < used:
                # the next document start after the boundary, within this part
                end = end_part if starts is None else at + starts[
                    bisect.bisect_right(starts, row - at)]
                end = min(end, row + size, used)
                if flat[row]:  # (the document's positions up to end are consecutive)
                    flat[row:end] = positions_of(end - row)
                row += size
            at = end_part
            if at >= used:
                break

    def state(self) -> dict[str, Any]:
        return {"held": [p.encode() for p, _, _ in self._held]}


PACKER = WrapPacker

"""``wrap``: concatenate documents and cut; a document may continue into the next sequence.

The carry-over between sequences is at most the tail of one document: ``{"held": [piece]}``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from datalane.engine.packers.base import (
    Held,
    PackContext,
    assemble,
    check_packer,
    decode_pieces,
    take,
)
from datalane.spec.errors import MismatchError
from datalane.spec.state import PackerState, Piece

__all__ = ["WrapPacker"]


class WrapPacker:
    name: ClassVar[str] = "wrap"

    def __init__(self, ctx: PackContext, state: PackerState | None = None) -> None:
        self.ctx = ctx
        self._held: list[Held] = []
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
        have = sum(len(cols[0]) for _, cols in self._held)
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
            piece, cols = self._held[0]
            if len(cols[0]) <= room:
                out.append(self._held.pop(0))
                room -= len(cols[0])
            else:
                cut = piece.start + room
                out.append((Piece(piece.source, piece.ref, piece.start, cut),
                            tuple(c[:room] for c in cols)))
                self._held[0] = (Piece(piece.source, piece.ref, cut, piece.stop),
                                 tuple(c[room:] for c in cols))
                room = 0
        return assemble(out, self.ctx)

    def state(self) -> dict[str, Any]:
        return {"held": [p.encode() for p, _ in self._held]}

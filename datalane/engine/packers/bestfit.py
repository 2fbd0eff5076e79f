"""``bestfit``: documents never cross sequences; each goes to the open sequence that fits it
with the least room left.

Documents longer than a sequence are split into full sequences plus a tail. A piece goes to
the open sequence with the least room that still fits it (ties: the oldest); when none of
``bestfit_bins`` open sequences fits and no new one may open, the fullest (ties: the oldest)
is emitted first. The carry-over is the open sequences' pieces and the rest of a document not
placed yet: ``{"bins": [[piece, ...], ...], "pending": piece or null}``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from datalane.engine.packers.base import (
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

__all__ = ["BestFitPacker"]


class BestFitPacker(PackerBase):
    name: ClassVar[str] = "bestfit"

    def __init__(self, ctx: PackContext, state: PackerState | None = None) -> None:
        self.ctx = ctx
        self.max_bins = ctx.options.bestfit_bins
        self._bins: list[list[Held]] = []
        self._fill: list[int] = []
        self._pending: Held | None = None
        data = check_packer(state, self.name, ctx.where)
        if data is None:
            return
        where = f"{ctx.where}.pack.{self.name}"
        legacy = state is not None and state.name is None
        if not legacy:
            extra = sorted(set(data) - {"bins", "pending"})
            if extra:
                raise MismatchError(f"{where} has unknown keys {extra}")
        groups = data.get("carry" if legacy else "bins", [])
        if not isinstance(groups, list):
            raise MismatchError(f"{where}.bins must be a list, got {type(groups).__name__}")
        if len(groups) > self.max_bins:
            raise MismatchError(f"{ctx.where}: the packer's carry-over has {len(groups)} open "
                                f"sequences; the recipe's packing keeps at most "
                                f"{self.max_bins}")
        bins = [decode_pieces(g, f"{where}.bins[{i}]") for i, g in enumerate(groups)]
        for g, group in enumerate(bins):
            tokens = sum(p.tokens for p in group)
            if not group:  # (a sequence is opened with its first piece: never empty)
                raise MismatchError(
                    f"{ctx.where}: open sequence {g} of the packer's carry-over holds no "
                    f"piece; the packer never keeps an empty one, so the state is damaged")
            if tokens > ctx.size:
                raise MismatchError(
                    f"{ctx.where}: open sequence {g} of the packer's carry-over holds "
                    f"{len(group)} pieces of {tokens} tokens, more than a sequence of "
                    f"{ctx.size} tokens can hold; the state is damaged")
        pending = data.get("pending")
        for group in bins:
            self._bins.append([ctx.held(p) for p in group])
            self._fill.append(sum(p.tokens for p in group))
        if pending is not None:
            self._pending = ctx.held(Piece.decode(pending, f"{where}.pending"))
        ctx.done_restoring()

    def _emit(self, index: int) -> dict[str, Any]:
        pieces = self._bins.pop(index)
        self._fill.pop(index)
        return assemble(pieces, self.ctx)

    def next_sequence(self) -> dict[str, Any] | None:
        size = self.ctx.size
        while True:
            if self._pending is None:
                self._pending = take(self.ctx)
                if self._pending is None:
                    return self._emit(0) if self._bins else None
            piece, cols, attached = self._pending
            length = len(cols[0])
            fit = min(length, size)
            head = (Piece(piece.source, piece.ref, piece.start, piece.start + fit),
                    tuple(c[:fit] for c in cols), attached)
            rest = None
            if fit < length:
                rest = (Piece(piece.source, piece.ref, piece.start + fit, piece.stop),
                        tuple(c[fit:] for c in cols), attached)
            best = -1
            for i, fill in enumerate(self._fill):
                room = size - fill
                if room >= fit and (best < 0 or room < size - self._fill[best]):
                    best = i
            if best < 0:
                if len(self._bins) >= self.max_bins:
                    fullest = max(range(len(self._fill)), key=lambda i: (self._fill[i], -i))
                    return self._emit(fullest)
                self._bins.append([])
                self._fill.append(0)
                best = len(self._bins) - 1
            self._bins[best].append(head)
            self._fill[best] += fit
            self._pending = rest
            if self._fill[best] == size:
                return self._emit(best)

    def state(self) -> dict[str, Any]:
        return {"bins": [[p.encode() for p, _, _ in b] for b in self._bins],
                "pending": self._pending[0].encode() if self._pending is not None else None}


PACKER = BestFitPacker

"""Packing: documents become sequences of ``seq_len + 1`` tokens (DESIGN section 3.4).

Each sequence comes with ``positions``: 0 at the start of every document and at the start of
every sequence (a document continued from the previous sequence starts again at 0), and -1 on
padding, so a trainer can build per-document attention masks and mask padded labels.

* :class:`WrapPacker` concatenates documents and cuts. Its carry-over between sequences is at
  most the tail of one document, saved as a reference ``(source, file, position, from, to)``.
* :class:`BestFitPacker` never lets a document cross sequences: documents longer than a
  sequence are split into full sequences plus a tail; pieces go to the open sequence with the
  least room that fits (ties: the oldest); with every one of ``bestfit_bins`` open sequences
  too full, the fullest is emitted first. Its carry-over is the open sequences' pieces.

Both emit at most one sequence per call and hold no tokens that are not in their saved
references, so a restore rebuilds them exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from datalane.engine.mixture import Mixture
from datalane.spec.state import Counters, Piece

__all__ = ["BestFitPacker", "Fetch", "Packer", "WrapPacker"]

Fetch = Callable[[Piece], np.ndarray]  # all tokens of a piece's document, re-read by reference
_Held = tuple[Piece, np.ndarray]  # a piece and its tokens


def _assemble(pieces: list[_Held], size: int, pad_id: int,
              counters: Counters) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full(size, pad_id, dtype=np.int32)
    positions = np.full(size, -1, dtype=np.int32)
    at = 0
    for _, tokens in pieces:
        n = len(tokens)
        ids[at:at + n] = tokens
        positions[at:at + n] = np.arange(n, dtype=np.int32)
        at += n
    counters.tokens += at
    counters.padding += size - at
    return ids, positions


class Packer:
    """Common surface: ``next_sequence()`` and ``carry()``."""

    def __init__(self, mixture: Mixture, size: int, pad_id: int, counters: Counters) -> None:
        self.mixture = mixture
        self.size = size
        self.pad_id = pad_id
        self.counters = counters

    def _take(self) -> _Held | None:
        got = self.mixture.next_doc()
        if got is None:
            return None
        source, file, pos, tokens = got
        self.counters.kept += 1
        return Piece(source, file, pos, 0, len(tokens)), tokens

    def next_sequence(self) -> tuple[np.ndarray, np.ndarray] | None:
        raise NotImplementedError

    def carry(self) -> tuple[tuple[tuple[Piece, ...], ...], Piece | None]:
        raise NotImplementedError


class WrapPacker(Packer):
    """Concatenate and cut; documents may continue into the next sequence."""

    def __init__(self, mixture: Mixture, size: int, pad_id: int, counters: Counters,
                 carry: tuple[tuple[Piece, ...], ...] = (), fetch: Fetch | None = None) -> None:
        super().__init__(mixture, size, pad_id, counters)
        self._held: list[_Held] = []
        for group in carry:
            for piece in group:
                assert fetch is not None  # a carry-over needs a way to re-read it
                self._held.append((piece, fetch(piece)[piece.start:piece.stop]))

    def next_sequence(self) -> tuple[np.ndarray, np.ndarray] | None:
        have = sum(len(t) for _, t in self._held)
        while have < self.size:
            got = self._take()
            if got is None:
                break
            self._held.append(got)
            have += len(got[1])
        if have == 0:
            return None
        out: list[_Held] = []
        room = self.size
        while self._held and room:
            piece, tokens = self._held[0]
            if len(tokens) <= room:
                out.append(self._held.pop(0))
                room -= len(tokens)
            else:
                cut = piece.start + room
                out.append((Piece(piece.source, piece.file, piece.pos, piece.start, cut),
                            tokens[:room]))
                self._held[0] = (Piece(piece.source, piece.file, piece.pos, cut, piece.stop),
                                 tokens[room:])
                room = 0
        return _assemble(out, self.size, self.pad_id, self.counters)

    def carry(self) -> tuple[tuple[tuple[Piece, ...], ...], Piece | None]:
        return ((tuple(p for p, _ in self._held),) if self._held else ()), None


class BestFitPacker(Packer):
    """Best-fit into a bounded set of open sequences; documents never cross sequences."""

    def __init__(self, mixture: Mixture, size: int, pad_id: int, counters: Counters,
                 bins: int, carry: tuple[tuple[Piece, ...], ...] = (),
                 pending: Piece | None = None, fetch: Fetch | None = None) -> None:
        super().__init__(mixture, size, pad_id, counters)
        self.max_bins = bins
        self._bins: list[list[_Held]] = []
        self._fill: list[int] = []
        cache: dict[tuple[int, int, int], np.ndarray] = {}

        def held(piece: Piece) -> _Held:
            assert fetch is not None  # a carry-over needs a way to re-read it
            key = (piece.source, piece.file, piece.pos)
            if key not in cache:
                cache[key] = fetch(piece)
            return piece, cache[key][piece.start:piece.stop]

        for group in carry:
            self._bins.append([held(p) for p in group])
            self._fill.append(sum(p.stop - p.start for p in group))
        self._pending: _Held | None = held(pending) if pending is not None else None

    def _emit(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        pieces = self._bins.pop(index)
        self._fill.pop(index)
        return _assemble(pieces, self.size, self.pad_id, self.counters)

    def next_sequence(self) -> tuple[np.ndarray, np.ndarray] | None:
        while True:
            if self._pending is None:
                self._pending = self._take()
                if self._pending is None:
                    return self._emit(0) if self._bins else None
            piece, tokens = self._pending
            take = min(len(tokens), self.size)
            head = (Piece(piece.source, piece.file, piece.pos, piece.start, piece.start + take),
                    tokens[:take])
            rest = None
            if take < len(tokens):
                rest = (Piece(piece.source, piece.file, piece.pos, piece.start + take,
                              piece.stop), tokens[take:])
            best = -1
            for i, fill in enumerate(self._fill):
                room = self.size - fill
                if room >= take and (best < 0 or room < self.size - self._fill[best]):
                    best = i
            if best < 0:
                if len(self._bins) >= self.max_bins:
                    fullest = max(range(len(self._fill)), key=lambda i: (self._fill[i], -i))
                    return self._emit(fullest)
                self._bins.append([])
                self._fill.append(0)
                best = len(self._bins) - 1
            self._bins[best].append(head)
            self._fill[best] += take
            self._pending = rest
            if self._fill[best] == self.size:
                return self._emit(best)

    def carry(self) -> tuple[tuple[tuple[Piece, ...], ...], Piece | None]:
        bins = tuple(tuple(p for p, _ in b) for b in self._bins)
        return bins, (self._pending[0] if self._pending is not None else None)

"""The mixture stage: exact token-weighted interleaving of sources (DESIGN section 3.4).

The next document comes from the source with the smallest ``consumed_tokens / weight``; ties
go to the earlier source. The only state is the per-source token counter; a source that runs
out is skipped from then on (its cursor says so, so nothing else needs saving).

:meth:`Mixture.next_run` takes documents in bulk: a run of the chosen source's documents as
long as that source would win every one of them, which is the same choice, document by
document, as :meth:`Mixture.next_doc` makes (the other sources' keys do not move meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from datalane.engine.documents.base import Doc, Run

__all__ = ["Mixture"]


class DocSource(Protocol):
    def next_doc(self) -> Doc | None: ...

    def next_run(self, need: int,
                 allow: Callable[[int], bool] | None = None) -> Run | None: ...


class Mixture:
    """Single ordered accumulator choosing which source feeds the packer next."""

    def __init__(self, streams: Sequence[DocSource], weights: list[float],
                 consumed: list[int] | None = None) -> None:
        self.streams = streams
        self.weights = weights
        self.consumed = list(consumed) if consumed is not None else [0] * len(streams)
        self._done = [False] * len(streams)

    def _key(self, i: int, consumed: int) -> float:
        return consumed / self.weights[i]

    def _choose(self) -> int:
        """The source the next document comes from (-1: every source has ended)."""
        best = -1
        best_key = 0.0
        for i, done in enumerate(self._done):
            if done:
                continue
            key = self._key(i, self.consumed[i])
            if best < 0 or key < best_key:
                best, best_key = i, key
        return best

    def next_doc(self) -> Doc | None:
        """The next document, or None when every source has ended."""
        while True:
            best = self._choose()
            if best < 0:
                return None
            got = self.streams[best].next_doc()
            if got is None:
                self._done[best] = True
                continue
            self.consumed[best] += len(got)
            return got

    def next_run(self, need: int) -> Run | None:
        """Documents of one source, in order, each one the document :meth:`next_doc` would
        give: taken while fewer than ``need`` tokens are taken and the source keeps winning
        (against an earlier source its key must stay smaller, against a later one no
        larger). None when every source has ended."""
        while True:
            best = self._choose()
            if best < 0:
                return None
            allow: Callable[[int], bool] | None = None
            others = [(i, self._key(i, self.consumed[i])) for i, done in enumerate(self._done)
                      if not done and i != best]
            if others:
                before = min((k for i, k in others if i < best), default=None)
                after = min((k for i, k in others if i > best), default=None)
                start = self.consumed[best]

                def wins(taken: int, best: int = best, start: int = start,
                          before: float | None = before, after: float | None = after) -> bool:
                    key = self._key(best, start + taken)
                    return (before is None or key < before) and (after is None or key <= after)

                allow = wins
            got = self.streams[best].next_run(need, allow)
            if got is None:
                self._done[best] = True
                continue
            self.consumed[best] += len(got)
            return got

"""The mixture stage: exact token-weighted interleaving of sources (DESIGN section 3.4).

The next document comes from the source with the smallest ``consumed_tokens / weight``; ties
go to the earlier source. The only state is the per-source token counter; a source that runs
out is skipped from then on (its cursor says so, so nothing else needs saving).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from datalane.engine.documents.base import Doc

__all__ = ["Mixture"]


class DocSource(Protocol):
    def next_doc(self) -> Doc | None: ...


class Mixture:
    """Single ordered accumulator choosing which source feeds the packer next."""

    def __init__(self, streams: Sequence[DocSource], weights: list[float],
                 consumed: list[int] | None = None) -> None:
        self.streams = streams
        self.weights = weights
        self.consumed = list(consumed) if consumed is not None else [0] * len(streams)
        self._done = [False] * len(streams)

    def next_doc(self) -> Doc | None:
        """The next document, or None when every source has ended."""
        while True:
            best = -1
            best_key = 0.0
            for i, done in enumerate(self._done):
                if done:
                    continue
                key = self.consumed[i] / self.weights[i]
                if best < 0 or key < best_key:
                    best, best_key = i, key
            if best < 0:
                return None
            got = self.streams[best].next_doc()
            if got is None:
                self._done[best] = True
                continue
            self.consumed[best] += len(got)
            return got

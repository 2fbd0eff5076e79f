"""The mixture stage: exact token-weighted interleaving of sources (docs/architecture.md, One lane).

The next document comes from the source with the smallest *pass*; ties go to the earlier
source. While the weights are those of step 0 the pass is ``consumed_tokens / weight`` (stride
scheduling), and a recipe without phases runs exactly that arithmetic. A source that runs out
is skipped from then on (its cursor says so, so nothing else needs saving); a source of weight
0 is never chosen.

Under a schedule (spec/phases.py) the lane tells the mixture its step at the start of every
window (:meth:`Mixture.at_step`). When the weights in force change, the mixture *re-bases*,
as stride scheduling does for a changed weight: the pass of source ``i`` is
``P_i + (consumed_i - a_i) / w_i``; at a change, with ``G`` the least pass of the sources in
the race both before and after (0 if none), each source keeps its lag ``(pass_i - G) *
w_old_i`` in tokens, ``P_i = G + lag_i / w_new_i`` and ``a_i = consumed_i``; a source joining
(weight 0 before) starts at ``P_i = G``. The lag of a source is always between 0 and its last
document's tokens, so over any run of constant weights the tokens taken match the weights
within one document per source, and over a ramp the tokens track the integral of the weights
with no drift (tests/engine/test_mixture_schedule.py).

"In the race" must not depend on what a restore forgets: the mixture learns that a source
ran out only when it asks it (a restored lane has not asked yet), so a source counts as out
only when its resume point says so (``ran_out``: its cursor is past its last epoch), which is
the same in a run and in its restore. The re-basing values
(:class:`~datalane.spec.state.MixtureBase`) are part of the lane state when the recipe has
phases.

:meth:`Mixture.next_run` takes documents in bulk: a run of the chosen source's documents as
long as that source would win every one of them, which is the same choice, document by
document, as :meth:`Mixture.next_doc` makes (the other sources' passes do not move meanwhile,
and the weights change only between windows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from datalane.engine.documents.base import Doc, Run
from datalane.spec.phases import Schedule
from datalane.spec.state import MixtureBase

__all__ = ["Mixture"]


class DocSource(Protocol):
    def next_doc(self) -> Doc | None: ...

    def next_run(self, need: int,
                 allow: Callable[[int], bool] | None = None) -> Run | None: ...


class Mixture:
    """Single ordered accumulator choosing which source feeds the packer next.

    ``weights`` are those in force now (at step ``step`` of ``schedule``, when one is given);
    ``base`` the re-basing values of a restored lane (None: no weight change so far);
    ``ran_out(i)`` whether source ``i``'s resume point is past its end."""

    def __init__(self, streams: Sequence[DocSource], weights: Sequence[float],
                 consumed: list[int] | None = None, *, schedule: Schedule | None = None,
                 step: int = 0, base: MixtureBase | None = None,
                 ran_out: Callable[[int], bool] | None = None) -> None:
        self.streams = streams
        self.weights = list(weights)
        self.consumed = list(consumed) if consumed is not None else [0] * len(streams)
        self.schedule = schedule if schedule is not None and not schedule.constant else None
        self._step = step
        self._done = [False] * len(streams)
        self._passes = list(base.passes) if base is not None else None
        self._anchors = list(base.anchors) if base is not None else None
        self._ran_out = ran_out or (lambda i: False)

    def _key(self, i: int, consumed: int) -> float:
        """The pass of source ``i`` after ``consumed`` tokens (weight > 0)."""
        w = self.weights[i]
        if self._passes is None:
            return consumed / w
        assert self._anchors is not None
        return self._passes[i] + (consumed - self._anchors[i]) / w

    def _choose(self) -> int:
        """The source the next document comes from (-1: every source has ended)."""
        best = -1
        best_key = 0.0
        for i, w in enumerate(self.weights):
            if self._done[i] or not w:
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
        (against an earlier source its pass must stay smaller, against a later one no
        larger). None when every source has ended."""
        while True:
            best = self._choose()
            if best < 0:
                return None
            allow: Callable[[int], bool] | None = None
            others = [(i, self._key(i, self.consumed[i])) for i, w in enumerate(self.weights)
                      if w and not self._done[i] and i != best] if len(self.weights) > 1 else ()
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

    def at_step(self, step: int) -> None:
        """Take the weights the schedule has in force at ``step`` (the lane's next window)."""
        if self.schedule is None or step == self._step:
            return
        self._step = step
        weights = self.schedule.weights(step)
        if list(weights) != self.weights:
            self.reweigh(weights)

    def reweigh(self, new: Sequence[float]) -> None:
        """Change the weights in force, keeping every source's lag (see the module text)."""
        old, consumed = self.weights, self.consumed
        n = len(old)
        passes = self._passes if self._passes is not None else [0.0] * n
        anchors = self._anchors if self._anchors is not None else [0] * n
        both = [passes[i] + (consumed[i] - anchors[i]) / old[i]
                for i in range(n) if old[i] and new[i] and not self._ran_out(i)]
        level = min(both) if both else 0.0
        out = []
        for i in range(n):
            if old[i] and new[i]:
                pass_i = passes[i] + (consumed[i] - anchors[i]) / old[i]
                if old[i] == new[i]:
                    out.append(pass_i)
                else:
                    lag = (pass_i - level) * old[i]
                    out.append(level + lag / new[i])
            else:  # joins (or leaves: its pass is never looked at while its weight is 0)
                out.append(level)
        self._passes = out
        self._anchors = list(consumed)
        self.weights = [float(w) for w in new]

    def base(self) -> MixtureBase:
        """The re-basing values, for the lane state of a recipe with phases."""
        n = len(self.consumed)
        return MixtureBase(tuple(self._passes) if self._passes is not None else (0.0,) * n,
                           tuple(self._anchors) if self._anchors is not None else (0,) * n)

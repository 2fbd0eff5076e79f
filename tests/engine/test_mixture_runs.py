"""The mixture in bulk: ``Mixture.next_run`` hands out runs of one source's documents.

A run lasts exactly as long as its source would win document after document under the rule
of ``test_mixture`` (least ``consumed / weight``, ties to the earlier source): against an
earlier source its key must stay *smaller*, against a later one *no larger*. So the
documents, in order, are the ones ``next_doc`` gives one at a time, and each run is as long
as the rule allows. Orders are worked out by hand next to each case.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from datalane.engine.documents.base import Run
from datalane.engine.mixture import Mixture
from tests.engine.test_mixture import FakeStream, order, streams


class FakeRunStream(FakeStream):
    """A FakeStream that also serves runs, asking ``allow`` before each document after the
    first as the document streams do."""

    def next_run(self, need: int, allow: Callable[[int], bool] | None = None) -> Run | None:
        lengths: list[int] = []
        while self.next < len(self.lengths):
            taken = sum(lengths)
            if lengths and not (taken < need and (allow is None or allow(taken))):
                break
            lengths.append(self.lengths[self.next])
            self.next += 1
        if not lengths:
            self.calls_after_end += 1
            return None
        offsets = np.cumsum([0, *lengths])
        ids = np.zeros(int(offsets[-1]), dtype=np.int32)
        return Run(self.source, (ids,), offsets, len(lengths), (0, self.next - 1))


def run_streams(*lengths: list[int]) -> list[FakeRunStream]:
    return [FakeRunStream(i, ls) for i, ls in enumerate(lengths)]


def runs(mixture: Mixture, count: int, need: int = 1000) -> list[str]:
    """The next ``count`` runs as letters, one per document ("BB": two of source 1)."""
    out = []
    for _ in range(count):
        got = mixture.next_run(need)
        out.append("." if got is None else "ABCD"[got.source] * got.docs)
    return out


def test_a_run_stops_when_it_would_tie_with_an_earlier_source() -> None:
    # weights 1:1, A docs of 2, B docs of 1: (0,0) tie -> A | (2,0) B | (2,1) B | (2,2) tie
    # -> A | (4,2) B | (4,3) B | (4,4) A: one at a time "ABBABBA"; B's run stops at the tie
    assert order(Mixture(streams([2] * 3, [1] * 4), [1.0, 1.0]), 7) == "ABBABBA"
    got = runs(Mixture(run_streams([2] * 3, [1] * 4), [1.0, 1.0]), 5)
    assert got == ["A", "BB", "A", "BB", "A"], (
        f"a later source's run must end where it ties with an earlier one (the tie goes to "
        f"the earlier source): {got}")


def test_a_run_goes_on_through_a_tie_with_a_later_source() -> None:
    # weights 1:1, A docs of 1, B docs of 2: (0,0) tie -> A | (1,0) B | (1,2) A | (2,2) tie
    # -> A | (3,2) B | (3,4) A | (4,4) tie -> A: "ABAABAA"
    assert order(Mixture(streams([1] * 5, [2] * 2), [1.0, 1.0]), 7) == "ABAABAA"
    got = runs(Mixture(run_streams([1] * 5, [2] * 2), [1.0, 1.0]), 5)
    assert got == ["A", "B", "AA", "B", "AA"], (
        f"an earlier source's run must go on through a tie with a later source: {got}")


def test_runs_follow_uneven_weights_and_skip_ended_sources() -> None:
    # weights 3:1, 1-token documents: "ABAAAB..." one at a time (see test_mixture)
    want = order(Mixture(streams([1] * 9, [1] * 3), [3.0, 1.0]), 13)
    got = "".join(runs(Mixture(run_streams([1] * 9, [1] * 3), [3.0, 1.0]), 13))
    assert got.rstrip(".") == want.rstrip("."), f"runs {got} != one at a time {want}"
    assert got.endswith("."), "after every source ended the mixture gives None"


def test_a_run_stops_once_it_has_the_tokens_asked_for() -> None:
    # one source, documents of 3: asking for 7 tokens takes 3 documents (3, 6, then 9 >= 7)
    mixture = Mixture(run_streams([3] * 10), [1.0])
    got = mixture.next_run(7)
    assert got is not None and got.docs == 3 and len(got) == 9, (
        f"a run takes documents while fewer than the tokens asked for are taken: "
        f"{got.docs if got else None}")
    assert mixture.consumed == [9], f"the mixture counts the run's tokens: {mixture.consumed}"


def test_a_source_that_ended_no_longer_bounds_the_others_runs() -> None:
    """Only sources still in the race bound a run: once a source has ended, its last pass
    must not cut the runs of the others short."""
    # weights 1:1, A has one 1-token document, B six: (0,0) tie -> A | (1,0) B, bounded by
    # A's pass 1 (B at 1 would tie and lose) | (1,1) tie -> A, which ends; B alone takes
    # its five remaining documents in one run
    got = runs(Mixture(run_streams([1], [1] * 6), [1.0, 1.0]), 4)
    assert got == ["A", "B", "BBBBB", "."], (
        f"an ended source must not bound another source's run: {got}")


def test_a_source_of_weight_0_does_not_bound_a_run() -> None:
    """A source of weight 0 is out of the race: it neither is chosen nor limits a run (its
    pass, tokens / 0, is never computed)."""
    got = runs(Mixture(run_streams([1] * 3, [2] * 3), [0.0, 1.0]), 2)
    assert got == ["BBB", "."], f"a weight-0 source must not bound the run of another: {got}"

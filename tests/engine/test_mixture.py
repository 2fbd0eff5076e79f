"""The mixture stage, choice by choice: which source feeds the packer next.

The rule (docs/architecture.md, One lane): the next document comes from the source with the smallest
``consumed_tokens / weight``; ties go to the earlier source; a source whose stream ended is
skipped from then on. Weights are shares of *tokens*, not of documents. The streams here are
fakes that hand out documents of chosen lengths, so every expected order below is worked out
by hand in the comment next to it.
"""

from __future__ import annotations

import pytest

from datalane.engine.documents.base import Doc
from datalane.engine.mixture import Mixture
from tests.support.stages import DOC0, make_doc, picked


class FakeStream:
    """Documents of the given lengths from one source, then None (and it counts calls after)."""

    def __init__(self, source: int, lengths: list[int], start: int = 0) -> None:
        self.source = source
        self.lengths = lengths
        self.next = start
        self.calls_after_end = 0

    def next_doc(self) -> Doc | None:
        if self.next >= len(self.lengths):
            self.calls_after_end += 1
            return None
        k = self.next
        self.next += 1
        n = self.lengths[k]
        return make_doc(self.source, (0, k), [DOC0 + k] + [4] * (n - 1))


def streams(*lengths: list[int]) -> list[FakeStream]:
    return [FakeStream(i, ls) for i, ls in enumerate(lengths)]


def order(mixture: Mixture, picks: int) -> str:
    """The sources of the next ``picks`` documents as letters (A = source 0), '.' for None."""
    out = []
    for _ in range(picks):
        got = mixture.next_doc()
        out.append("." if got is None else "ABCD"[picked(got)[0]])
    return "".join(out)


def test_equal_weights_alternate_and_ties_go_to_the_earlier_source() -> None:
    # lengths 10 everywhere: (0,0) tie -> A; (10,0) -> B; (10,10) tie -> A; ...
    mixture = Mixture(streams([10] * 5, [10] * 5), [1.0, 1.0])
    assert order(mixture, 6) == "ABABAB", (
        "equal weights and equal lengths must alternate, ties going to the earlier source")


def test_three_to_one_in_tokens() -> None:
    # weights 3:1, every document 1 token; keys are consumed/weight:
    # (0,0) tie -> A | (1/3, 0) -> B | (1/3, 1) -> A | (2/3, 1) -> A | (1, 1) tie -> A |
    # (4/3, 1) -> B | (4/3, 2) -> A | (5/3, 2) -> A | (2, 2) tie -> A | (7/3, 2) -> B
    mixture = Mixture(streams([1] * 20, [1] * 20), [3.0, 1.0])
    got = order(mixture, 10)
    assert got[4] == "A", f"the tie at keys (1, 1) must go to the earlier source A: {got}"
    assert got == "ABAAABAAAB", f"weights 3:1 must choose by the least consumed/weight: {got}"
    assert mixture.consumed == [7, 3], "consumed must count the tokens taken from each source"


def test_three_sources_with_different_document_lengths() -> None:
    # weights 1:2:1, lengths A=4, B=2, C=3; consumed -> keys (consumed / weight):
    # (0,0,0) keys 0,0,0 -> A        (4,0,0) keys 4,0,0 tie B,C -> B
    # (4,2,0) keys 4,1,0 -> C        (4,2,3) keys 4,1,3 -> B
    # (4,4,3) keys 4,2,3 -> B        (4,6,3) keys 4,3,3 tie B,C -> B
    # (4,8,3) keys 4,4,3 -> C        (4,8,6) keys 4,4,6 tie A,B -> A
    # (8,8,6) keys 8,4,6 -> B        (8,10,6) keys 8,5,6 -> B
    # (8,12,6) keys 8,6,6 tie B,C -> B   (8,14,6) keys 8,7,6 -> C   => (8,14,9)
    mixture = Mixture(streams([4] * 9, [2] * 9, [3] * 9), [1.0, 2.0, 1.0])
    got = order(mixture, 12)
    assert got == "ABCBBBCABBBC", (
        f"weights 1:2:1 with lengths 4, 2, 3 must choose the least consumed/weight, ties to "
        f"the earlier source: {got}")
    assert mixture.consumed == [8, 14, 9], "consumed must count the tokens taken per source"


def test_weights_are_token_shares_long_documents_count_more() -> None:
    # equal weights, A's documents are 10 tokens, B's 1: after one A document (10, 0) B is
    # chosen until it has 10 tokens too, then the tie (10, 10) goes to A.
    mixture = Mixture(streams([10] * 5, [1] * 40), [1.0, 1.0])
    got = order(mixture, 23)
    assert got == "A" + "B" * 10 + "A" + "B" * 10 + "A", (
        f"weights are shares of tokens: one 10-token document must balance ten 1-token "
        f"documents: {got}")
    assert mixture.consumed == [30, 20], "consumed must count tokens, not documents"


def test_an_ended_stream_is_skipped_from_then_on() -> None:
    # A has 2 documents, B 5 (all 1 token, equal weights): A B A B, then A ends (asked once,
    # it answered None) and B goes on alone; then everything has ended.
    a, b = streams([1, 1], [1] * 5)
    mixture = Mixture([a, b], [1.0, 1.0])
    got = order(mixture, 9)
    assert got == "ABABBBB..", f"an ended stream must be skipped, the others go on: {got}"
    assert a.calls_after_end == 1, (
        f"a stream that returned None must never be asked again (asked {a.calls_after_end} "
        f"times after its end)")
    assert b.calls_after_end == 1, "the last stream must be asked once after its end"
    assert mixture.consumed == [2, 5], "an ended stream's counter must stay as it was"


def test_an_ended_stream_does_not_block_a_lighter_source() -> None:
    # A ends with the smallest key (0 tokens, weight 1): B must still be read.
    a, b = streams([], [3, 3])
    assert order(Mixture([a, b], [1.0, 1.0]), 3) == "BB.", (
        "a source that ended with the smallest key must not end the mixture")


def test_documents_come_in_stream_order_with_their_references() -> None:
    mixture = Mixture(streams([2, 2, 2], [5, 5]), [1.0, 1.0])
    got = [picked(mixture.next_doc()) for _ in range(5)]
    # A(2) B(5) A(4) A(6) B(10)
    assert [(s, ref) for s, ref, _ in got] == [(0, (0, 0)), (1, (0, 0)), (0, (0, 1)),
                                               (0, (0, 2)), (1, (0, 1))], (
        "the mixture must pass each stream's documents on in order with their references")
    assert [int(t[0]) - DOC0 for _, _, t in got] == [0, 0, 1, 2, 1], (
        "the mixture must pass each document's tokens on unchanged")
    assert [len(t) for _, _, t in got] == [2, 5, 2, 2, 5], "documents must keep their lengths"


@pytest.mark.parametrize("split", [1, 3, 4, 7, 11])
def test_restored_counters_continue_the_same_choices(split: int) -> None:
    lengths = ([4, 1, 6, 2, 2, 5, 3, 1, 1, 7, 2, 4], [3] * 12, [1, 9, 2, 2, 8, 1, 1, 3, 2, 2])
    weights = [1.0, 2.0, 0.5]
    reference = order(Mixture(streams(*lengths), weights), 20)
    fakes = streams(*lengths)
    first = Mixture(fakes, weights)
    head = order(first, split)
    consumed = list(first.consumed)
    positions = [s.next for s in fakes]
    resumed = Mixture([FakeStream(i, ls, positions[i]) for i, ls in enumerate(lengths)],
                      weights, consumed)
    tail = order(resumed, 20 - split)
    assert head + tail == reference, (
        f"a mixture restored from its consumed counters after {split} documents must make "
        f"the same choices as one that never stopped")
    assert resumed.consumed is not consumed, "the mixture must own a copy of its counters"

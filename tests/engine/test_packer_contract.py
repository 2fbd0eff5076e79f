"""Every declared packer keeps the packer contract (datalane/engine/packers/base.py).

Over the same synthetic documents (token ``j`` of document ``k`` is ``1000 * (k + 1) + j``,
tests/engine/packers/test_packers.py), with and without a loss mask: every token of the input
appears exactly once in the output, in its document's order within each piece (no packer drops one:
``bestfit`` splits a long document, ``wrap`` cuts it); a packer rebuilt from the state it
saved after any sequence, fed from the same point, emits exactly the sequences the unbroken
packer emitted after it; a packer that fills whole windows (``fills_windows``) fills them with
exactly the sequences :meth:`next_sequence` gives; documents that carry attachments (an
image at its placeholder run's first token) have each placed once, in the sequence holding
that token, at it, before and after a restore. Every declared packer
(:data:`datalane.spec.packing.DECLARED`) runs here without a line for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from datalane.engine.documents.base import Attached, Doc, Run
from datalane.engine.packers import PACKERS
from datalane.spec.packing import DECLARED, PACKER_NAMES, WHOLE_PACKERS
from tests.engine.packers.test_packers import SIZE, Feed, Pieces, packer_of, run

LENGTHS = [5, 3, 6, 2, 7, 19, 1, 4, 8, 11, 2, 2, 6, 3, 9, 1, 5, 16, 8, 1]


def test_the_registry_is_the_declaration() -> None:
    assert list(PACKERS) == list(PACKER_NAMES)
    for spec in DECLARED:
        assert PACKERS[spec.name].name == spec.name


@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("algorithm", PACKER_NAMES)
def test_every_token_appears_exactly_once(algorithm: str, masks: bool) -> None:
    pieces = [p for seq in run(packer_of(algorithm, Feed(LENGTHS, masks), bins=3)[0])
              for p in seq]
    for k, n in enumerate(LENGTHS):
        mine = sorted((start, stop) for doc, start, stop in pieces if doc == k)
        covered = [t for start, stop in mine for t in range(start, stop)]
        assert covered == list(range(n)), (
            f"{algorithm}: document {k} of {n} tokens comes out as pieces {mine}")
    assert {doc for doc, _, _ in pieces} == set(range(len(LENGTHS)))


@pytest.mark.parametrize("algorithm", WHOLE_PACKERS)
def test_a_whole_packer_never_splits_a_document_that_fits(algorithm: str) -> None:
    """A packer declared ``whole`` (what a vision source needs: an image's placeholder run
    may not cross sequences) puts every document of at most ``SIZE`` tokens in one piece."""
    assert WHOLE_PACKERS == ("bestfit",)
    pieces = [p for seq in run(packer_of(algorithm, Feed(LENGTHS), bins=3)[0]) for p in seq]
    for k, n in enumerate(LENGTHS):
        mine = sorted((start, stop) for doc, start, stop in pieces if doc == k)
        if n <= SIZE:
            assert mine == [(0, n)], f"{algorithm}: document {k} of {n} tokens split: {mine}"


@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("algorithm", PACKER_NAMES)
def test_resume_from_a_saved_state_anywhere_gives_the_same_sequences(algorithm: str,
                                                                     masks: bool) -> None:
    whole = run(packer_of(algorithm, Feed(LENGTHS, masks), bins=3)[0])
    assert len(whole) > 5
    for k in range(len(whole) + 1):
        feed = Feed(LENGTHS, masks)
        packer, _ = packer_of(algorithm, feed, bins=3)
        assert [run_one(packer) for _ in range(k)] == whole[:k]
        state = packer.state()
        resumed = Feed(LENGTHS, masks, start=feed.next)  # the mixture resumes where it was
        again, _ = packer_of(algorithm, resumed, bins=3, state=state)
        assert run(again) == whole[k:], f"{algorithm}: resumed after sequence {k}"


def run_one(packer: object) -> list[tuple[int, int, int]]:
    got = run_limited(packer, 1)
    assert len(got) == 1
    return got[0]


def run_limited(packer: object, n: int) -> list[list[tuple[int, int, int]]]:
    from tests.engine.packers.test_packers import pieces_of

    out = []
    for _ in range(n):
        seq = packer.next_sequence()  # type: ignore[attr-defined]
        assert seq is not None
        out.append(pieces_of(seq))
    return out


@pytest.mark.parametrize("algorithm", [n for n in PACKER_NAMES if PACKERS[n].fills_windows])
def test_filling_a_window_is_the_same_as_sequence_by_sequence(algorithm: str) -> None:
    from tests.engine.packers.test_packers import pieces_of

    whole = run(packer_of(algorithm, Feed(LENGTHS))[0])
    feed = Feed(LENGTHS)
    packer, _ = packer_of(algorithm, feed)

    def next_run(need: int) -> Run | None:  # the mixture in bulk: one document per run
        doc = feed.next_doc()
        if doc is None:
            return None
        n = len(doc)
        return Run(doc.source, doc.columns, [0, n], 1, doc.ref)

    packer.ctx.next_run = next_run
    rows = len(whole) + 2
    columns = {c.name: np.empty(c.shape(rows, SIZE), dtype=c.np_dtype)
               for c in packer.ctx.schema}
    filled = packer.fill_window(columns, rows)
    assert filled == len(whole)
    got = [pieces_of({n: a[r] for n, a in columns.items()}) for r in range(rows)]
    assert got == [*whole, [], []]


# -- documents that carry attachments -------------------------------------------------------------

#: the token offsets of each document's attachments (a vision document's image at its first
#: placeholder, token 1 after vision_start; an interleaved one's images at each run's first;
#: a text document none), for the documents of LENGTHS, long ones included
ATTACH: list[tuple[int, ...]] = [(1,), (), (1, 4), (1,), (1, 3, 5), (1, 9, 17), (0,), (), (1, 6),
                                 (1, 8), (1,), (), (2,), (1,), (1, 7), (), (4,), (1, 15), (7,),
                                 ()]


class AttachingFeed(Feed):
    """:class:`Feed`'s documents, each carrying its :data:`ATTACH` ments (value: the document
    and the attachment's index), on a re-read (``fetch``) as the first time."""

    def __init__(self, lengths: list[int], attach: list[tuple[int, ...]], start: int = 0) -> None:
        super().__init__(lengths, start=start)
        self.attach = attach

    def doc(self, k: int) -> Doc:
        d = super().doc(k)
        return Doc(d.source, d.ref, d.columns,
                   tuple(Attached(at, (k, i)) for i, at in enumerate(self.attach[k])))


Placed = list[tuple[int, Any]]


def run_placed(packer: Any, attach: list[tuple[int, ...]],
               limit: int | None = None) -> list[tuple[Pieces, Placed]]:
    """Each sequence's pieces and the attachments the packer placed in it (``ctx.placed``),
    until the packer ends (or ``limit`` sequences); each attachment must sit at the token of
    its document that ``attach`` names."""
    from tests.engine.packers.test_packers import pieces_of

    out: list[tuple[Pieces, Placed]] = []
    while limit is None or len(out) < limit:
        seq = packer.next_sequence()
        if seq is None:
            assert limit is None, "the packer ended early"
            return out
        out.append((pieces_of(seq), list(packer.ctx.placed)))
        for at, (k, i) in packer.ctx.placed:
            assert seq["input_ids"][at] == 1000 * (k + 1) + attach[k][i], (
                f"attachment {i} of document {k} placed at token {at}, which is "
                f"{seq['input_ids'][at]}")
        assert len(out) < 100, "the packer never ended"
    return out


@pytest.mark.parametrize("algorithm", PACKER_NAMES)
def test_each_attachment_goes_once_with_its_documents_token(algorithm: str) -> None:
    """Every attachment is placed exactly once, in the sequence that holds its document's
    token at its offset, at that token (a document cut across sequences, by ``wrap`` or by
    ``bestfit`` past a sequence, leaves each attachment with the piece holding its token);
    resumed from a state saved after any sequence, the re-read documents bring theirs again
    and the packer places the same attachments as the unbroken one."""
    assert len(ATTACH) == len(LENGTHS)
    assert all(at < n for a, n in zip(ATTACH, LENGTHS, strict=True) for at in a)
    whole = run_placed(packer_of(algorithm, AttachingFeed(LENGTHS, ATTACH), bins=3)[0], ATTACH)
    placed = sorted(v for _, got in whole for _, v in got)
    assert placed == [(k, i) for k, a in enumerate(ATTACH) for i in range(len(a))]
    for k in range(len(whole) + 1):
        feed = AttachingFeed(LENGTHS, ATTACH)
        packer, _ = packer_of(algorithm, feed, bins=3)
        assert run_placed(packer, ATTACH, k) == whole[:k]
        again, _ = packer_of(algorithm, AttachingFeed(LENGTHS, ATTACH, start=feed.next), bins=3,
                             state=packer.state())
        assert run_placed(again, ATTACH) == whole[k:], f"{algorithm}: resumed after sequence {k}"


@pytest.mark.parametrize("algorithm", WHOLE_PACKERS)
def test_a_whole_packer_places_attachments_with_their_whole_documents_by_hand(
        algorithm: str) -> None:
    """Two open sequences of 8 tokens. d0 (6 tokens, an image at 1) opens sequence A; d1 (5,
    images at 1 and 3) does not fit A's 2 left and opens B; d2 (2, an image at 1) fits both and
    goes to A, the one with the least room, which is full: A = d0 d2, images at 1 and 6 + 1 = 7.
    d3 (3, none) fills B: B = d1 d3, images at 1 and 3. d4 (4, an image at 2) opens a sequence
    that the end flushes: image at 2."""
    lengths, attach = [6, 5, 2, 3, 4], [(1,), (1, 3), (1,), (), (2,)]
    got = run_placed(packer_of(algorithm, AttachingFeed(lengths, attach), bins=2)[0], attach)
    assert got == [
        ([(0, 0, 6), (2, 0, 2)], [(1, (0, 0)), (7, (2, 0))]),
        ([(1, 0, 5), (3, 0, 3)], [(1, (1, 0)), (3, (1, 1))]),
        ([(4, 0, 4)], [(2, (4, 0))]),
    ]

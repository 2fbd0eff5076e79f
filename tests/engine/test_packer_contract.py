"""Every declared packer keeps the packer contract (datalane/engine/packers/base.py).

Over the same synthetic documents (token ``j`` of document ``k`` is ``1000 * (k + 1) + j``,
tests/engine/packers/test_packers.py), with and without a loss mask: every token of the input
appears exactly once in the output, in its document's order within each piece (no packer drops one:
``bestfit`` splits a long document, ``wrap`` cuts it); a packer rebuilt from the state it
saved after any sequence, fed from the same point, emits exactly the sequences the unbroken
packer emitted after it; a packer that fills whole windows (``fills_windows``) fills them with
exactly the sequences :meth:`next_sequence` gives. Every declared packer
(:data:`datalane.spec.packing.DECLARED`) runs here without a line for it.
"""

from __future__ import annotations

import numpy as np
import pytest

from datalane.engine.documents.base import Run
from datalane.engine.packers import PACKERS
from datalane.spec.packing import DECLARED, PACKER_NAMES, WHOLE_PACKERS
from tests.engine.packers.test_packers import SIZE, Feed, packer_of, run

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
        return Run(doc.source, doc.columns, [0, n], 1, doc.ref,
                   np.arange(n, dtype=np.int32))

    packer.ctx.next_run = next_run
    rows = len(whole) + 2
    columns = {c.name: np.empty(c.shape(rows, SIZE), dtype=c.np_dtype)
               for c in packer.ctx.schema}
    filled = packer.fill_window(columns, rows)
    assert filled == len(whole)
    got = [pieces_of({n: a[r] for n, a in columns.items()}) for r in range(rows)]
    assert got == [*whole, [], []]

"""The parts every packer shares (:mod:`datalane.engine.packers.base`), by hand.

:func:`assemble` lays pieces out in one sequence (document columns copied, positions 0.. per
piece, pad values after) and places the attachments whose token the sequence holds;
:func:`take` hands the mixture's next document over as one whole piece; the restore helpers
(:meth:`PackContext.held`, :func:`check_packer`, :func:`decode_pieces`) read a carry-over back
or refuse it naming the bad value. Documents are :class:`Feed`'s (token ``j`` of document ``k``
is ``1000 * (k + 1) + j``, reference ``(7, k)``); sequences are 8 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from datalane.engine.documents.base import Attached
from datalane.engine.packers import PACKERS, PackContext
from datalane.engine.packers.base import (
    ARANGE,
    assemble,
    check_packer,
    decode_pieces,
    positions_of,
    take,
)
from datalane.spec.errors import MismatchError
from datalane.spec.recipe import Packing
from datalane.spec.schema import Column, text_schema
from datalane.spec.state import Counters, PackerState, Piece
from tests.engine.packers.test_packers import PAD, SIZE, Feed

#: input_ids, positions, two more document columns (a loss mask, labels), and a per-image
#: column (the lane builds it, not assemble)
SCHEMA = text_schema(PAD, (Column("loss_mask", "uint8", 0, default=1),
                           Column("labels", "int32", -100),
                           Column("image_sizes", "int32", 0, per_token=False, image="image",
                                  width=2)))


def context(feed: Feed | None = None, counters: Counters | None = None) -> PackContext:
    feed = feed or Feed([])
    return PackContext(feed.next_doc, feed.fetch, SIZE, SCHEMA, counters or Counters(),
                       Packing(algorithm="wrap"))  # type: ignore[arg-type]


def test_a_context_starts_with_nothing_placed_or_cached() -> None:
    """Each context has its own (empty) list of placed attachments, no bulk feed unless given
    one, and its repr leaves out the cache of re-read documents (their columns)."""
    feed = Feed([4])
    a, b = context(feed), context()
    assert a.placed == [] and a.placed is not b.placed and a.next_run is None
    assert a.where == "lane state"
    a.held(Piece(0, (7, 0), 0, 4))
    assert "_cache" not in repr(a)
    given = PackContext(feed.next_doc, feed.fetch, SIZE, SCHEMA, Counters(),
                        Packing(algorithm="wrap"), "lane 2 state", next_run=len)  # type: ignore[arg-type]
    assert given.next_run is len and given.where == "lane 2 state"


def test_assemble_lays_pieces_out_with_positions_padding_and_attachments() -> None:
    """Tokens 2..4 of document 0 (mask 1 0 1, labels 12 13 14; images at document tokens 1,
    2 and 5), then tokens 0..1 of document 1 (mask 0 1, labels 20 21; images at 0 and 1).
    Sequence: 1002 1003 1004 2000 2001, then 3 of padding (id 0, position -1, mask 0, label
    -100). Document 0's image at token 1 lies
    before its piece and the one at 5 at its stop: neither is placed; the one at 2 is the
    piece's first token, sequence token 0; document 1's follow at 3 + 0 and 3 + 1."""
    doc0 = (np.arange(1000, 1005, dtype=np.int32), np.array([0, 0, 1, 0, 1], np.uint8),
            np.arange(10, 15, dtype=np.int32))
    doc1 = (np.arange(2000, 2002, dtype=np.int32), np.array([0, 1], np.uint8),
            np.arange(20, 22, dtype=np.int32))
    pieces = [
        (Piece(0, (7, 0), 2, 5), tuple(c[2:5] for c in doc0),
         (Attached(1, "a1"), Attached(2, "a2"), Attached(5, "a5"))),
        (Piece(0, (7, 1), 0, 2), doc1, (Attached(0, "b0"), Attached(1, "b1"))),
    ]
    counters = Counters(tokens=10, padding=1)
    ctx = context(counters=counters)
    ctx.placed = [(0, "from the sequence before")]
    out = assemble(pieces, ctx)
    assert list(out) == ["input_ids", "positions", "loss_mask", "labels"], (
        f"assemble builds the per-token columns in schema order, the per-image ones are the "
        f"lane's: {list(out)}")
    assert out["input_ids"].tolist() == [1002, 1003, 1004, 2000, 2001, 0, 0, 0]
    assert out["positions"].tolist() == [0, 1, 2, 0, 1, -1, -1, -1]
    assert out["loss_mask"].tolist() == [1, 0, 1, 0, 1, 0, 0, 0]
    assert out["labels"].tolist() == [12, 13, 14, 20, 21, -100, -100, -100]
    assert [a.dtype for a in out.values()] == [np.int32, np.int32, np.uint8, np.int32]
    assert ctx.placed == [(0, "a2"), (3, "b0"), (4, "b1")], (
        f"the attachments whose token the sequence holds, at their offset in it: {ctx.placed}")
    assert (counters.tokens, counters.padding) == (15, 4), (
        f"5 tokens and 3 of padding are added to the lane's counters: {counters}")


def test_assemble_of_no_pieces_is_all_padding() -> None:
    ctx = context()
    out = assemble([], ctx)
    assert out["input_ids"].tolist() == [0] * SIZE and out["positions"].tolist() == [-1] * SIZE
    assert ctx.placed == [] and (ctx.counters.tokens, ctx.counters.padding) == (0, SIZE)


def test_positions_of_a_piece_longer_than_the_table() -> None:
    """A piece longer than :data:`ARANGE` (a carried document over several windows) gets all
    its positions, not the table's length of them."""
    n = len(ARANGE) + 3
    got = positions_of(n)
    assert len(got) == n and got.dtype == np.int32 and got[-3:].tolist() == [n - 3, n - 2, n - 1]
    assert positions_of(len(ARANGE))[-1] == len(ARANGE) - 1
    assert positions_of(3).tolist() == [0, 1, 2]


def test_take_hands_over_whole_documents_and_counts_them() -> None:
    feed = Feed([3, 2])
    ctx = context(feed)
    piece, cols, attached = take(ctx)  # type: ignore[misc]
    assert piece == Piece(0, (7, 0), 0, 3) and cols[0].tolist() == [1000, 1001, 1002]
    assert attached == () and ctx.counters.kept == 1
    assert take(ctx) is not None and take(ctx) is None, "two documents, then none"
    assert ctx.counters.kept == 2, "only documents taken are counted as kept"


# -- restoring ------------------------------------------------------------------------------------

def test_a_carried_piece_is_re_read_once_per_document_and_may_end_at_its_end() -> None:
    feed = Feed([5, 4])
    ctx = context(feed)
    piece, cols, _ = ctx.held(Piece(0, (7, 0), 1, 3))
    assert piece == Piece(0, (7, 0), 1, 3) and cols[0].tolist() == [1001, 1002]
    assert ctx.held(Piece(0, (7, 0), 3, 5))[1][0].tolist() == [1003, 1004], (
        "a piece may end at its document's last token")
    assert feed.fetched == [(0, (7, 0))], "each carried document is read once"


def test_a_carried_piece_past_its_document_is_refused() -> None:
    with pytest.raises(MismatchError) as info:
        context(Feed([5])).held(Piece(0, (7, 0), 2, 6))
    assert str(info.value) == ("lane state: carried piece [0, [7, 0], 2, 6] ends after its "
                               "document's 5 tokens")


def test_check_packer_names_the_packer_that_wrote_the_state() -> None:
    assert check_packer(None, "wrap", "w") is None, "no state: a fresh packer"
    data = {"held": []}
    assert check_packer(PackerState("wrap", data), "wrap", "w") is data
    assert check_packer(PackerState(None, data), "wrap", "w") is data, "version 1: unnamed"
    with pytest.raises(MismatchError) as info:
        check_packer(PackerState("bestfit", data), "wrap", "lane 3 state")
    assert str(info.value) == "lane 3 state was packed by 'bestfit'; the recipe packs with 'wrap'"


def test_decode_pieces_refuses_what_is_not_a_list_of_pieces() -> None:
    assert decode_pieces([[0, [7, 1], 0, 2]], "w") == [Piece(0, (7, 1), 0, 2)]
    with pytest.raises(MismatchError) as info:
        decode_pieces({"0": [0, [7, 1], 0, 2]}, "s.held")
    assert str(info.value) == "s.held must be a list of pieces, got dict"
    with pytest.raises(MismatchError, match=r"^s.held\[1\] must be \[source, \[reference"):
        decode_pieces([[0, [7, 1], 0, 2], [0, 7, 0, 2]], "s.held")


def test_a_packer_without_the_bulk_hook_says_so() -> None:
    packer = PACKERS["bestfit"](context())
    assert not packer.fills_windows
    with pytest.raises(NotImplementedError, match=r"packer 'bestfit' does not fill whole windows"):
        packer.fill_window({}, 1)

"""A packer's carry-over read back (``Packer(ctx, state)``): the forms it accepts, what it
then emits, and the damaged states it refuses naming the bad value.

The documents are :class:`~tests.engine.packers.test_packers.Feed`'s (token ``j`` of document
``k`` is ``1000 * (k + 1) + j``, reference ``(7, k)`` of source 0), so a carried piece
``[0, [7, k], start, stop]`` is tokens ``start..stop-1`` of document ``k``, and every expected
sequence below is a list of pieces ``(document, start, stop)`` worked out by hand (size 8).
A state is built the way the lane state holds it: ``PackerState(name, json)``, or
``PackerState(None, {"carry": ..., "pending": ...})`` for lane-state version 1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from datalane.engine.packers import PACKERS, PackContext
from datalane.spec.errors import MismatchError
from datalane.spec.recipe import Packing
from datalane.spec.schema import text_schema
from datalane.spec.state import Counters, PackerState, Piece
from tests.engine.packers.test_packers import PAD, SIZE, Feed, pieces_of, run


def piece(k: int, start: int, stop: int) -> list[Any]:
    """The JSON of a carried piece of document ``k``."""
    return [0, [7, k], start, stop]


def restored(algorithm: str, feed: Feed, state: PackerState, bins: int = 8) -> Any:
    ctx = PackContext(feed.next_doc, feed.fetch, SIZE, text_schema(PAD), Counters(),
                      Packing(algorithm=algorithm, bestfit_bins=bins))  # type: ignore[arg-type]
    return PACKERS[algorithm](ctx, PackerState(state.name, json.loads(json.dumps(state.data))))


def refusal(algorithm: str, state: PackerState, bins: int = 8, lengths: tuple[int, ...] = (
        20,) * 4) -> str:
    with pytest.raises(MismatchError) as info:
        restored(algorithm, Feed(list(lengths)), state, bins)
    return str(info.value)


# -- bestfit --------------------------------------------------------------------------------------

def test_bestfit_restores_as_many_open_sequences_as_the_recipe_keeps() -> None:
    """2 open sequences allowed, 2 carried: A[0:5] (5) and B[2:6] (4), nothing pending; the
    feed goes on with C=4 and D=3. C fits neither (rooms 3 and 4: B's 4 fits) -> B's
    sequence, full: [B2-6 C]. D=3 -> A's room of 3: [A D]. Nothing left."""
    feed = Feed([5, 6, 4, 3], start=2)
    packer = restored("bestfit", feed, PackerState(
        "bestfit", {"bins": [[piece(0, 0, 5)], [piece(1, 2, 6)]], "pending": None}), bins=2)
    assert run(packer) == [[(1, 2, 6), (2, 0, 4)], [(0, 0, 5), (3, 0, 3)]]


def test_bestfit_restores_an_open_sequence_that_is_exactly_full() -> None:
    """A carried open sequence of exactly 8 tokens is what a sequence holds (the bound is
    "more than a sequence"): restored, it stays the oldest and the end flushes it first."""
    feed = Feed([5, 3, 3], start=2)
    packer = restored("bestfit", feed, PackerState(
        "bestfit", {"bins": [[piece(0, 0, 5), piece(1, 0, 3)]], "pending": None}))
    assert run(packer) == [[(0, 0, 5), (1, 0, 3)], [(2, 0, 3)]]


def test_bestfit_restores_a_version_1_carry_over() -> None:
    """Lane-state version 1 kept bestfit's open sequences as ``carry`` and the rest of a
    document as ``pending``. Carried: A=5 and B=6 open (2 allowed), C[1:4] pending; the feed
    goes on with D=3. C's rest (3) fits A's room of 3 (B has 2): [A C1-4] full. D=3 fits
    nowhere (B's room 2), 1 open of 2: opens. The end flushes B, then D."""
    feed = Feed([5, 6, 4, 3], start=3)
    packer = restored("bestfit", feed, PackerState(None, {
        "carry": [[piece(0, 0, 5)], [piece(1, 0, 6)]], "pending": piece(2, 1, 4)}), bins=2)
    assert run(packer) == [[(0, 0, 5), (2, 1, 4)], [(1, 0, 6)], [(3, 0, 3)]]


def test_bestfit_refuses_unknown_keys() -> None:
    assert refusal("bestfit", PackerState("bestfit", {"bins": [], "pending": None,
                                                      "held": []})) == (
        "lane state.pack.bestfit has unknown keys ['held']")


def test_bestfit_refuses_open_sequences_that_are_not_a_list() -> None:
    assert refusal("bestfit", PackerState("bestfit", {"bins": {"0": []}})) == (
        "lane state.pack.bestfit.bins must be a list, got dict")


def test_bestfit_refuses_more_open_sequences_than_the_recipe_keeps() -> None:
    state = PackerState("bestfit", {"bins": [[piece(k, 0, 2)] for k in range(3)],
                                    "pending": None})
    assert refusal("bestfit", state, bins=2) == (
        "lane state: the packer's carry-over has 3 open sequences; the recipe's packing keeps "
        "at most 2")


def test_bestfit_refuses_an_open_sequence_over_a_sequence() -> None:
    """The second open sequence holds 5 + 4 = 9 tokens, one more than a sequence of 8."""
    state = PackerState("bestfit", {"bins": [[piece(0, 0, 2)],
                                             [piece(1, 0, 5), piece(2, 0, 4)]],
                                    "pending": None})
    assert refusal("bestfit", state) == (
        "lane state: open sequence 1 of the packer's carry-over holds 2 pieces of 9 tokens, "
        "more than a sequence of 8 tokens can hold; the state is damaged")


@pytest.mark.parametrize("algorithm", ["bestfit", None])
def test_bestfit_refuses_an_empty_open_sequence(algorithm: str | None) -> None:
    """A sequence is opened with its first piece, so a carried open sequence with none is
    damage (restored, the end would flush it as a sequence of padding): refused by its
    index, in the current and the version-1 form."""
    key = "bins" if algorithm else "carry"
    state = PackerState(algorithm, {key: [[piece(0, 0, 2)], []], "pending": None})
    assert refusal("bestfit", state) == (
        "lane state: open sequence 1 of the packer's carry-over holds no piece; the packer "
        "never keeps an empty one, so the state is damaged")


def test_a_restore_keeps_no_document_it_re_read() -> None:
    """The documents re-read for a restore are cached only while it lasts (each read once):
    the cache would otherwise pin every one of them for the lane's life."""
    feed = Feed([5, 6], start=2)
    packer = restored("bestfit", feed, PackerState(
        "bestfit", {"bins": [[piece(0, 0, 2), piece(0, 2, 5)]], "pending": piece(1, 0, 6)}))
    assert feed.fetched == [(0, (7, 0)), (0, (7, 1))], "each carried document read once"
    packer.ctx.held(Piece(0, (7, 0), 0, 2))
    assert feed.fetched[2:] == [(0, (7, 0))], "after the restore, a piece is read anew"


# -- wrap -----------------------------------------------------------------------------------------

def test_wrap_restores_its_held_tail_and_saves_what_it_holds_next() -> None:
    """Held: D[3:7] (4 tokens); the feed goes on with E=6: [D3-7 E0-4], E's tail E[4:6]
    held (and saved), then [E4-6 + 6 of padding]."""
    feed = Feed([5, 6, 2, 7, 6], start=4)
    packer = restored("wrap", feed, PackerState("wrap", {"held": [piece(3, 3, 7)]}))
    assert packer.state() == {"held": [piece(3, 3, 7)]}
    assert pieces_of(packer.next_sequence()) == [(3, 3, 7), (4, 0, 4)]
    assert packer.state() == {"held": [piece(4, 4, 6)]}
    assert run(packer) == [[(4, 4, 6)]]
    assert packer.state() == {"held": []}


def test_wrap_restores_a_version_1_carry_over() -> None:
    """Version 1 kept wrap's tail as the one open sequence of ``carry`` (``pending`` always
    null): B[3:6] carried, then C=2 and D=7: [B3-6 C D0-3], [D3-7 + padding]. No open
    sequence at all is a fresh start."""
    feed = Feed([5, 6, 2, 7], start=2)
    packer = restored("wrap", feed, PackerState(None, {"carry": [[piece(1, 3, 6)]],
                                                       "pending": None}))
    assert run(packer) == [[(1, 3, 6), (2, 0, 2), (3, 0, 3)], [(3, 3, 7)]]
    fresh = restored("wrap", Feed([3, 5]), PackerState(None, {"carry": [], "pending": None}))
    assert run(fresh) == [[(0, 0, 3), (1, 0, 5)]]


def test_wrap_refuses_a_version_1_pending_piece_or_second_open_sequence() -> None:
    assert refusal("wrap", PackerState(None, {"carry": [], "pending": piece(0, 0, 3)})) == (
        "lane state has a pending piece, which only 'bestfit' packing keeps; the recipe packs "
        "with 'wrap'")
    two = PackerState(None, {"carry": [[piece(0, 0, 3)], [piece(1, 0, 2)]], "pending": None})
    assert refusal("wrap", two) == (
        "lane state: the packer's carry-over has 2 open sequences; the recipe's packing keeps "
        "at most 1")


def test_wrap_refuses_unknown_keys_and_a_held_that_is_not_a_list() -> None:
    assert refusal("wrap", PackerState("wrap", {"held": [], "bins": []})) == (
        "lane state.pack.wrap has unknown keys ['bins']")
    assert refusal("wrap", PackerState("wrap", {"held": {"0": piece(0, 0, 3)}})) == (
        "lane state.pack.wrap.held must be a list of pieces, got dict")


def test_wrap_holds_pieces_that_fill_one_sequence_before_its_last() -> None:
    """Pieces before the last may fill a sequence (8 tokens: A=5, B=3) but no more; the last,
    a document's tail, may run on over several (C[0:20]). Then D=2: [A B], [C0-8], [C8-16],
    [C16-20 D]."""
    feed = Feed([5, 3, 20, 2], start=3)
    packer = restored("wrap", feed, PackerState("wrap", {"held": [
        piece(0, 0, 5), piece(1, 0, 3), piece(2, 0, 20)]}))
    assert run(packer) == [[(0, 0, 5), (1, 0, 3)], [(2, 0, 8)], [(2, 8, 16)],
                           [(2, 16, 20), (3, 0, 2)]]


def test_wrap_refuses_held_pieces_over_a_sequence_before_the_last() -> None:
    """A=5 and B[0:4] hold 9 tokens before the last piece: more than a sequence of 8."""
    state = PackerState("wrap", {"held": [piece(0, 0, 5), piece(1, 0, 4), piece(2, 0, 2)]})
    assert refusal("wrap", state) == (
        "lane state: open sequence 0 of the packer's carry-over holds 3 pieces of 11 tokens, "
        "more than a sequence of 8 tokens can hold; the state is damaged")

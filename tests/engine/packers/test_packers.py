"""The packers through the packer protocol, sequence by sequence, on hand-chosen documents.

A packer (``datalane.engine.packers``) pulls documents from ``ctx.next_doc`` and emits one
sequence of ``ctx.size`` tokens per call, as the schema's columns: document columns copied
from the pieces it placed, ``positions`` 0.. within every piece, pad values after the last
piece. ``wrap`` concatenates and cuts; ``bestfit`` never lets a document cross sequences
(longer ones become full sequences plus a tail), puts each piece into the open sequence with
the LEAST room that fits (ties: the oldest), and when none of ``bestfit_bins`` open sequences
fits, emits the fullest (ties: the oldest); at the end it flushes the open ones oldest first.

Documents here are synthetic: token ``j`` of document ``k`` is ``1000 * (k + 1) + j``, so
every emitted token says which document piece it is, and the expected sequences below are
lists of pieces ``(document, start, stop)`` worked out by hand (size 8 throughout).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

from datalane.engine.documents.base import Doc
from datalane.engine.packers import PACKERS, PackContext
from datalane.spec.recipe import Packing
from datalane.spec.schema import Column, SampleSchema, text_schema
from datalane.spec.state import Counters, PackerState
from tests.support.stages import make_doc

SIZE = 8
PAD = 0
MASKED = text_schema(PAD, (Column("loss_mask", "uint8", 0, default=1),))
Pieces = list[tuple[int, int, int]]


def tokens_of(k: int, n: int) -> np.ndarray:
    out: np.ndarray = np.arange(1000 * (k + 1), 1000 * (k + 1) + n, dtype=np.int32)
    return out


def mask_of(k: int, n: int) -> np.ndarray:
    """A mask pattern of its own per document: 0 where (j + k) % 3 == 0."""
    out: np.ndarray = ((np.arange(n) + k) % 3 != 0).astype(np.uint8)
    return out


class Feed:
    """The mixture's side of a packer: documents of the given lengths, in order, then None."""

    def __init__(self, lengths: list[int], masks: bool = False, start: int = 0) -> None:
        self.lengths = lengths
        self.masks = masks
        self.next = start
        self.fetched: list[tuple[int, tuple[int, ...]]] = []

    def doc(self, k: int) -> Doc:
        n = self.lengths[k]
        extra = (mask_of(k, n),) if self.masks else ()
        return make_doc(0, (7, k), tokens_of(k, n), *extra)  # ref: (file 7, position k)

    def next_doc(self) -> Doc | None:
        if self.next >= len(self.lengths):
            return None
        self.next += 1
        return self.doc(self.next - 1)

    def fetch(self, source: int, ref: tuple[int, ...]) -> Doc:
        assert source == 0 and ref[0] == 7, f"fetch of a reference never handed out: {ref}"
        self.fetched.append((source, ref))
        return self.doc(ref[1])


def packer_of(algorithm: str, feed: Feed, bins: int = 8, state: Any = None,
              schema: SampleSchema | None = None) -> tuple[Any, Counters]:
    counters = Counters()
    schema = schema or (MASKED if feed.masks else text_schema(PAD))
    ctx = PackContext(feed.next_doc, feed.fetch, SIZE, schema, counters,
                      Packing(algorithm=algorithm, bestfit_bins=bins))  # type: ignore[arg-type]
    if state is not None:
        state = PackerState(algorithm, json.loads(json.dumps(state)))
    return PACKERS[algorithm](ctx, state), counters


def pieces_of(seq: dict[str, np.ndarray]) -> Pieces:
    """The document pieces of one emitted sequence, checking positions, padding and masks."""
    ids, pos = seq["input_ids"], seq["positions"]
    assert ids.shape == pos.shape == (SIZE,) and ids.dtype == pos.dtype == np.int32, (
        f"a sequence's input_ids and positions are int32 of {SIZE}: {ids.dtype}{ids.shape}")
    out: Pieces = []
    at = 0
    while at < SIZE and ids[at] != PAD:
        k, start = divmod(int(ids[at]), 1000)
        k -= 1
        n = 1
        while at + n < SIZE and ids[at + n] == ids[at] + n:
            n += 1
        assert pos[at:at + n].tolist() == list(range(n)), (
            f"positions must count 0.. within every piece (a document continued from an "
            f"earlier sequence starts again at 0): piece {(k, start, start + n)} has "
            f"{pos[at:at + n].tolist()}")
        if "loss_mask" in seq:
            want = mask_of(k, start + n)[start:]
            assert seq["loss_mask"][at:at + n].tolist() == want.tolist(), (
                f"the loss mask must travel with its tokens: piece {(k, start, start + n)}")
        out.append((k, start, start + n))
        at += n
    assert (ids[at:] == PAD).all() and (pos[at:] == -1).all(), (
        f"after the last piece a sequence must be padding (pad id, position -1): {ids} {pos}")
    if "loss_mask" in seq:
        assert (seq["loss_mask"][at:] == 0).all(), "padding must have the loss mask off"
    return out


def run(packer: Any, limit: int = 100) -> list[Pieces]:
    out: list[Pieces] = []
    for _ in range(limit):
        seq = packer.next_sequence()
        if seq is None:
            assert packer.next_sequence() is None, "a packer that ended must stay ended"
            return out
        assert list(seq) == list(packer.ctx.schema.names), (
            f"a sequence must hold the schema's columns in schema order: {list(seq)}")
        out.append(pieces_of(seq))
    raise AssertionError("the packer never ended")


def whole(lengths: list[int], *ks: int) -> Pieces:
    return [(k, 0, lengths[k]) for k in ks]


def test_the_registry_holds_both_packers() -> None:
    assert {"bestfit", "wrap"} <= set(PACKERS)
    assert all(cls.name == name for name, cls in PACKERS.items()), (
        "each packer's name must be its registry key (it names its state in the lane state)")


# -- bestfit ------------------------------------------------------------------------------------

def test_bestfit_chooses_the_open_sequence_with_the_least_room() -> None:
    # A=5 -> new S0 (room 3); B=6 -> new S1 (room 2); C=4 -> new S2 (room 4);
    # D=2 fits S0 (3), S1 (2), S2 (4): least room is S1 -> [B D] full, emitted.
    # E=3 fits S0 (3), S2 (4): S0 -> [A E] full.  F=1 -> S2 (5), G=3 -> S2 full: [C F G]
    lengths = [5, 6, 4, 2, 3, 1, 3]
    got = run(packer_of("bestfit", Feed(lengths), bins=3)[0])
    assert got[0] == whole(lengths, 1, 3), (
        f"best fit must choose the open sequence with the least room that fits (D=2 into "
        f"B's room of 2, not A's 3 or C's 4): {got[0]}")
    assert got[1] == whole(lengths, 0, 4), (
        f"best fit must choose the open sequence with the least room (E=3 into A's room of 3, "
        f"not C's 4): {got[1]}")
    assert got == [whole(lengths, 1, 3), whole(lengths, 0, 4), whole(lengths, 2, 5, 6)], (
        f"best fit on {lengths} with 3 open sequences: {got}")


def test_bestfit_ties_go_to_the_oldest_open_sequence() -> None:
    # A=5 (S0 room 3), B=6 (S1 room 2), C=5 (S2 room 3); D=2 -> S1 full [B D];
    # open now S0 (A, room 3), S2 (C, room 3): E=3 ties -> the oldest, S0: [A E];
    # F=3 -> S2: [C F]
    lengths = [5, 6, 5, 2, 3, 3]
    got = run(packer_of("bestfit", Feed(lengths), bins=3)[0])
    assert got[1] == whole(lengths, 0, 4), (
        f"best fit ties (equal room) must go to the oldest open sequence: {got[1]}")
    assert got == [whole(lengths, 1, 3), whole(lengths, 0, 4), whole(lengths, 2, 5)], (
        f"best fit on {lengths} with 3 open sequences: {got}")


def test_bestfit_with_every_open_sequence_too_full_emits_the_fullest() -> None:
    # 2 open sequences: A=5 (S0), B=6 (S1); C=4 fits neither and no third may open:
    # emit the fullest, S1 [B]; C opens a new one behind S0; D=3 fits S0 (room 3) and the
    # new C sequence (room 4): least room -> [A D]; the end flushes [C]
    lengths = [5, 6, 4, 3]
    got = run(packer_of("bestfit", Feed(lengths), bins=2)[0])
    assert got[0] == whole(lengths, 1), (
        f"with every open sequence too full, best fit must emit the fullest first (B=6, not "
        f"A=5): {got[0]}")
    assert got == [whole(lengths, 1), whole(lengths, 0, 3), whole(lengths, 2)], (
        f"best fit on {lengths} with 2 open sequences, emitting the fullest when full: {got}")


def test_bestfit_fullest_ties_go_to_the_oldest() -> None:
    # A=5 (S0), B=5 (S1), C=4 fits neither: both hold 5, emit the oldest [A]; C opens;
    # D=3 -> least room is B's 3 -> [B D]; the end flushes [C]
    lengths = [5, 5, 4, 3]
    got = run(packer_of("bestfit", Feed(lengths), bins=2)[0])
    assert got[0] == whole(lengths, 0), (
        f"when the fullest open sequences tie, best fit must emit the oldest: {got[0]}")
    assert got == [whole(lengths, 0), whole(lengths, 1, 3), whole(lengths, 2)], (
        f"best fit on {lengths} with 2 open sequences, the oldest of the fullest first: {got}")


def test_bestfit_flushes_the_open_sequences_oldest_first_at_the_end() -> None:
    # A=3 (S0), B=6 (S1: A's room 5 < 6), C=7 (S2): nothing fills up; the end flushes
    # S0, S1, S2 in the order they opened, not by fill
    lengths = [3, 6, 7]
    got = run(packer_of("bestfit", Feed(lengths))[0])
    assert got == [whole(lengths, 0), whole(lengths, 1), whole(lengths, 2)], (
        f"at the end best fit must flush its open sequences oldest first: {got}")


def test_bestfit_splits_a_long_document_into_full_sequences_plus_a_tail() -> None:
    # A=3 (S0); B=19: head B[0:8] needs a fresh sequence: new, full -> [B0-8]; again
    # [B8-16]; the tail B[16:19] (3) fits S0 (room 5) -> S0 = A + B-tail (6);
    # C=2 -> S0 full: [A B16-19 C]
    lengths = [3, 19, 2]
    got = run(packer_of("bestfit", Feed(lengths))[0])
    assert got == [[(1, 0, 8)], [(1, 8, 16)], [(0, 0, 3), (1, 16, 19), (2, 0, 2)]], (
        f"a document longer than a sequence must become full sequences plus a tail placed "
        f"by best fit: {got}")


def test_bestfit_a_long_document_with_no_room_to_open_emits_first() -> None:
    # one open sequence allowed: A=5 (S0); B=10: its head (8) fits nowhere, none may open:
    # emit [A]; then [B0-8]; the tail B[8:10] waits in S0; the end flushes it
    lengths = [5, 10]
    got = run(packer_of("bestfit", Feed(lengths), bins=1)[0])
    assert got == [[(0, 0, 5)], [(1, 0, 8)], [(1, 8, 10)]], f"{got}"


# -- wrap ---------------------------------------------------------------------------------------

def test_wrap_concatenates_and_cuts_with_positions_restarting() -> None:
    # 5, 6, 2, 7 into 8: [A0-5 B0-3] [B3-6 C0-2 D0-3] [D3-7 + 4 padding]
    lengths = [5, 6, 2, 7]
    got = run(packer_of("wrap", Feed(lengths))[0])
    assert got == [[(0, 0, 5), (1, 0, 3)], [(1, 3, 6), (2, 0, 2), (3, 0, 3)], [(3, 3, 7)]], (
        f"wrap must concatenate documents in order and cut at every {SIZE} tokens: {got}")


def test_wrap_a_long_document_spans_sequences() -> None:
    # A=19, B=3: [A0-8] [A8-16] [A16-19 B0-3 + 2 padding]
    got = run(packer_of("wrap", Feed([19, 3]))[0])
    assert got == [[(0, 0, 8)], [(0, 8, 16)], [(0, 16, 19), (1, 0, 3)]], f"{got}"


def test_wrap_exact_fit_ends_without_a_padding_sequence() -> None:
    got = run(packer_of("wrap", Feed([3, 5, 8]))[0])
    assert got == [[(0, 0, 3), (1, 0, 5)], [(2, 0, 8)]], (
        f"documents filling sequences exactly must leave no extra sequence: {got}")


def test_no_documents_no_sequences() -> None:
    for algorithm in PACKERS:
        assert run(packer_of(algorithm, Feed([]))[0]) == [], f"{algorithm} without documents"


# -- both ---------------------------------------------------------------------------------------

MIXED = [5, 3, 6, 2, 7, 19, 1, 4, 8, 11, 2, 2, 6, 3, 9, 1, 5]
MIXED_BESTFIT = [
    # documents A..Q = 0..16, 3 open sequences at most; "open:" lists them oldest first
    # A5 opens; B3 fits its room 3: [A B] full, emitted (#1)
    # C6 opens; D2 fits its room 2: [C D] (#2)
    # E7 opens. F19: its head F0-8 fits nowhere (E has room 1): opens, full (#3); F8-16 the
    #   same (#4); the tail F16-19 (3) opens.                       open: E 7, Ft 3
    # G1: rooms 1 (E) and 5 (Ft): the least is E: [E G] (#5).     open: Ft 3
    # H4 -> Ft (room 5).                                           open: FtH 7
    # I8 opens, full (#6). J11: J0-8 opens, full (#7); the tail J8-11 (3) opens.
    # K2, L2 -> Jt (rooms 1 and 5, then 1 and 3).                  open: FtH 7, JtKL 7
    # M6 opens (rooms 1, 1).                                       open: FtH 7, JtKL 7, M 6
    # N3: rooms 1, 1, 2, none fits, 3 are open: emit the fullest, FtH and JtKL tie at 7:
    #   the oldest, FtH (#8); N3 then opens.                       open: JtKL 7, M 6, N 3
    # O9: head O0-8 fits nowhere, 3 open: emit the fullest JtKL (#9); O0-8 opens, full
    #   (#10); the tail O8-9 (1): rooms 2 (M) and 5 (N): M.       open: MOt 7, N 3
    # P1 -> MOt (room 1, the least): full (#11). Q5 -> N (room 5): full (#12). Nothing left.
    [(0, 0, 5), (1, 0, 3)],
    [(2, 0, 6), (3, 0, 2)],
    [(5, 0, 8)],
    [(5, 8, 16)],
    [(4, 0, 7), (6, 0, 1)],
    [(8, 0, 8)],
    [(9, 0, 8)],
    [(5, 16, 19), (7, 0, 4)],
    [(9, 8, 11), (10, 0, 2), (11, 0, 2)],
    [(14, 0, 8)],
    [(12, 0, 6), (14, 8, 9), (15, 0, 1)],
    [(13, 0, 3), (16, 0, 5)],
]


def test_bestfit_on_a_longer_stream_by_hand() -> None:
    packer, counters = packer_of("bestfit", Feed(MIXED), bins=3)
    got = run(packer)
    assert got == MIXED_BESTFIT, f"best fit on {MIXED} with 3 open sequences: {got}"
    assert counters.kept == len(MIXED), "kept counts documents, not pieces"
    assert counters.tokens == sum(MIXED) and counters.tokens + counters.padding == (
        len(got) * SIZE), f"tokens + padding must add up to sequences x size: {counters}"


@pytest.mark.parametrize("algorithm", ["wrap", "bestfit"])
def test_every_token_once_and_counters(algorithm: str) -> None:
    packer, counters = packer_of(algorithm, Feed(MIXED), bins=3)
    got = run(packer)
    placed = sorted(p for seq in got for p in seq)
    covered: dict[int, list[tuple[int, int]]] = {}
    for k, start, stop in placed:
        covered.setdefault(k, []).append((start, stop))
    for k, n in enumerate(MIXED):
        ranges = covered.get(k, [])
        assert ranges and ranges[0][0] == 0 and ranges[-1][1] == n and all(
                a[1] == b[0] for a, b in itertools.pairwise(ranges)), (
            f"{algorithm}: document {k} ({n} tokens) must be emitted exactly once, whole: "
            f"{ranges}")
    assert counters.kept == len(MIXED) and counters.tokens == sum(MIXED), (
        f"{algorithm}: kept counts documents and tokens their tokens: {counters}")
    assert counters.padding == len(got) * SIZE - sum(MIXED), (
        f"{algorithm}: padding must count every padding token emitted: {counters}")
    if algorithm == "wrap":
        assert counters.padding == -sum(MIXED) % SIZE, "wrap pads only its last sequence"


@pytest.mark.parametrize("algorithm", ["wrap", "bestfit"])
@pytest.mark.parametrize("masks", [False, True])
def test_restore_from_state_mid_way_continues_identically(algorithm: str, masks: bool) -> None:
    reference = [s for s in _sequences(packer_of(algorithm, Feed(MIXED, masks), bins=3)[0])]
    for split in range(len(reference) + 1):
        feed = Feed(MIXED, masks)
        first, _ = packer_of(algorithm, feed, bins=3)
        head = [first.next_sequence() for _ in range(split)]
        state = first.state()
        resumed_feed = Feed(MIXED, masks, start=feed.next)
        resumed, _ = packer_of(algorithm, resumed_feed, bins=3, state=state)
        tail = list(_sequences(resumed))
        got = head + tail
        assert len(got) == len(reference), (
            f"{algorithm}: restored after {split} sequences, the packer must emit the same "
            f"number of sequences")
        for i, (a, b) in enumerate(zip(got, reference, strict=True)):
            for name in b:
                np.testing.assert_array_equal(
                    a[name], b[name], err_msg=f"{algorithm}: restored after {split} "
                    f"sequences, sequence {i} column {name!r} differs from the uninterrupted run")
        held = {ref for _, ref in resumed_feed.fetched}
        assert len(held) == len(resumed_feed.fetched), (
            f"{algorithm}: a restore must re-read each carried document once: "
            f"{resumed_feed.fetched}")


def _sequences(packer: Any) -> Any:
    while (seq := packer.next_sequence()) is not None:
        yield seq


@pytest.mark.parametrize("algorithm", ["wrap", "bestfit"])
def test_masks_travel_with_their_tokens(algorithm: str) -> None:
    # pieces_of checks every token's mask against its document's mask at that offset
    got = run(packer_of(algorithm, Feed(MIXED, masks=True), bins=3)[0])
    assert sum(stop - start for seq in got for _, start, stop in seq) == sum(MIXED), (
        f"{algorithm}: every token must be emitted with its mask")


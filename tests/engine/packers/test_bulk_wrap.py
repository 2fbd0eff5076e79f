"""``wrap`` filling a whole window at once from runs of documents (``fill_window``).

The lane asks a packer that can for a whole window (``rows`` sequences) in one call, and the
mixture hands it documents in *runs*: consecutive documents of one source as flat columns
with their offsets (``datalane.engine.documents.base.Run``). The window must be exactly the
``rows`` sequences that ``next_sequence`` would have emitted one by one: the same pieces,
positions restarting at every document and at every sequence (also inside a run and inside
a document that spans several sequences), the same carry-over, counters and padding.

Same synthetic documents as ``test_packers``: token ``j`` of document ``k`` is
``1000 * (k + 1) + j``; ``pieces_of`` reads a sequence back as ``(document, start, stop)``
pieces and checks positions, padding and masks. Expectations are worked out by hand
(size 8).
"""

from __future__ import annotations

import numpy as np
import pytest

from datalane.engine.documents.base import Run
from datalane.engine.packers import PackContext, base, wrap
from datalane.spec.recipe import MAX_SEQ_LEN, Packing
from datalane.spec.schema import Column, SampleSchema, text_schema
from datalane.spec.state import Counters, PackerState
from tests.engine.packers.test_packers import SIZE, Feed, packer_of, pieces_of


class RunFeed(Feed):
    """A Feed that also hands out runs: ``groups`` documents at a time (cycling), each run
    cut short once ``need`` tokens are taken, as the mixture's ``next_run`` does."""

    def __init__(self, lengths: list[int], groups: list[int], masks: bool = False) -> None:
        super().__init__(lengths, masks)
        self.groups = groups
        self.runs = 0

    def next_run(self, need: int) -> Run | None:
        if self.next >= len(self.lengths):
            return None
        limit = self.groups[self.runs % len(self.groups)]
        self.runs += 1
        docs = []
        taken = 0
        while self.next < len(self.lengths) and len(docs) < limit and (not docs
                                                                        or taken < need):
            docs.append(self.doc(self.next))
            taken += len(docs[-1])
            self.next += 1
        offsets = np.cumsum([0] + [len(d) for d in docs])
        columns = tuple(np.concatenate([d.columns[c] for d in docs])
                        for c in range(len(docs[0].columns)))
        return Run(0, columns, offsets, len(docs), docs[-1].ref)


def window_packer(feed: RunFeed, state=None):
    packer, counters = packer_of("wrap", feed, state=state)
    packer.ctx.next_run = feed.next_run
    return packer, counters


def fill(packer, rows: int) -> tuple[int, list[list[tuple[int, int, int]]]]:
    schema = packer.ctx.schema
    columns = {c.name: np.full((rows, SIZE), 77, dtype=c.np_dtype) for c in schema}
    got = packer.fill_window(columns, rows)
    return got, [pieces_of({k: v[r] for k, v in columns.items()}) for r in range(rows)]


def test_a_window_is_the_sequences_cut_from_the_documents_in_order() -> None:
    # 5, 6, 2, 7 in one run, rows 2: [A0-5 B0-3] [B3-6 C0-2 D0-3], D3-7 carried
    packer, counters = window_packer(RunFeed([5, 6, 2, 7], [4]))
    rows, seqs = fill(packer, 2)
    assert (rows, seqs) == (2, [[(0, 0, 5), (1, 0, 3)], [(1, 3, 6), (2, 0, 2), (3, 0, 3)]]), (
        f"a window must be the documents concatenated and cut every {SIZE} tokens, positions "
        f"restarting at each document and each row (also inside one run): {rows} {seqs}")
    assert packer.state() == {"held": [[0, [7, 3], 3, 7]]}, (
        f"the rest of the cut document is the carry-over: {packer.state()}")
    assert (counters.kept, counters.tokens, counters.padding) == (4, 16, 0)
    rows, seqs = fill(packer, 2)
    assert (rows, seqs) == (1, [[(3, 3, 7)], []]), (
        f"the carried piece starts the next window (positions from 0 again), then padding; "
        f"1 row holds data: {rows} {seqs}")
    assert (counters.tokens, counters.padding) == (20, 12), (
        f"tokens and padding of the second window: {counters.tokens} {counters.padding}")


def test_a_document_spanning_rows_restarts_its_positions_in_every_row() -> None:
    # A=19 in rows of 8: [A0-8] [A8-16] [A16-19 B0-3 + 2 padding]
    packer, _ = window_packer(RunFeed([19, 3], [2]))
    rows, seqs = fill(packer, 3)
    assert (rows, seqs) == (3, [[(0, 0, 8)], [(0, 8, 16)], [(0, 16, 19), (1, 0, 3)]]), (
        f"{rows} {seqs}")


@pytest.mark.parametrize("groups", [[1], [2], [3, 1], [100]])
def test_runs_of_any_size_give_the_sequences_of_next_sequence(groups: list[int]) -> None:
    lengths = [5, 3, 6, 2, 7, 19, 1, 4, 8, 11, 2, 2, 6, 3, 9, 1, 5]
    for rows in (1, 2, 3):
        ref, _ = packer_of("wrap", Feed(lengths, masks=True))
        want = []
        while (seq := ref.next_sequence()) is not None:
            want.append(pieces_of(seq))
        packer, counters = window_packer(RunFeed(lengths, groups, masks=True))
        got: list[list[tuple[int, int, int]]] = []
        while True:
            n, seqs = fill(packer, rows)
            got += seqs[:n]
            assert all(s == [] for s in seqs[n:]), f"rows past the data must be padding: {seqs}"
            if n < rows:
                break
        assert got == want, f"runs of {groups}, windows of {rows} rows: {got} != {want}"
        assert counters.tokens == sum(lengths) and counters.kept == len(lengths)


def test_an_exact_fit_leaves_nothing_carried_and_the_next_window_ends() -> None:
    packer, _ = window_packer(RunFeed([3, 5, 8], [1]))
    assert fill(packer, 2) == (2, [[(0, 0, 3), (1, 0, 5)], [(2, 0, 8)]])
    assert packer.state() == {"held": []}
    assert fill(packer, 2) == (0, [[], []]), "no document left: a window of padding"


def test_a_restored_carry_over_fills_the_first_window() -> None:
    # the state holds document 1 from token 2 on (of 6): [B2-6 C0-4] then [C4-5 D0-7]
    lengths = [5, 6, 5, 7]
    feed = RunFeed(lengths, [3])
    feed.next = 2
    packer, _ = window_packer(feed, state={"held": [[0, [7, 1], 2, 6]]})
    assert feed.fetched == [(0, (7, 1))], "the carried document is re-read by reference"
    rows, seqs = fill(packer, 2)
    assert (rows, seqs) == (2, [[(1, 2, 6), (2, 0, 4)], [(2, 4, 5), (3, 0, 7)]]), f"{seqs}"


def test_a_carried_piece_longer_than_the_position_table_gets_all_its_positions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The packers take positions from a table of 2^20 + 1 (any sequence fits); a document
    # spanning windows is carried as one piece that can be longer. With the table cut to 8
    # (= SIZE), the carried A16-36 (20 tokens) must still count 0..19 before rows restart:
    # window 2 = [A16-24] [A24-32] [A32-36 B0-3 pad]. (fill_window writes each piece of a
    # row from its own view of the table: cut to 8 too, it must never need more than a row.)
    table = np.arange(SIZE, dtype=np.int32)
    monkeypatch.setattr(base, "ARANGE", table)
    monkeypatch.setattr(wrap, "_COUNT", table.data)
    packer, counters = window_packer(RunFeed([36, 3], [1]))
    assert fill(packer, 2) == (2, [[(0, 0, 8)], [(0, 8, 16)]])
    assert packer.state()["held"][0][2:] == [16, 36], packer.state()
    columns = {c.name: np.full((3, SIZE), 77, dtype=c.np_dtype) for c in packer.ctx.schema}
    assert packer.fill_window(columns, 3) == 3
    assert columns["positions"].reshape(-1).tolist() == (
        list(range(8)) * 2 + [0, 1, 2, 3, 0, 1, 2, -1]), (
        f"every position of a carried piece longer than the table must be written, the "
        f"window stepping by the piece's real length: {columns['positions'].tolist()}")
    assert columns["input_ids"][2].tolist()[:7] == [1032, 1033, 1034, 1035, 2000, 2001, 2002]
    assert (counters.tokens, counters.padding) == (39, 1)


def test_a_restored_carry_of_two_pieces_counts_each_from_zero() -> None:
    # A version-1 state (no packer name) may carry an open sequence of several pieces: here
    # B2-6 and C0-3. The window starts with both, each counting its positions from 0, then
    # the feed's next documents: [B2-6 C0-3 D0-1] [D1-6 E0-3]
    feed = RunFeed([5, 6, 5, 6, 4], [2])
    feed.next = 3
    packer, _ = packer_of("wrap", feed, state=None)
    state = PackerState(None, {"carry": [[[0, [7, 1], 2, 6], [0, [7, 2], 0, 3]]]})
    packer = type(packer)(packer.ctx, state)
    packer.ctx.next_run = feed.next_run
    assert feed.fetched == [(0, (7, 1)), (0, (7, 2))]
    rows, seqs = fill(packer, 2)
    assert (rows, seqs) == (2, [[(1, 2, 6), (2, 0, 3), (3, 0, 1)], [(3, 1, 6), (4, 0, 3)]]), (
        f"every carried piece starts its own count of positions: {seqs}")


def test_a_window_filled_exactly_takes_no_document_more() -> None:
    # 3 + 5 + 8 fill two rows of 8 exactly: document 3 stays in the feed, nothing is carried,
    # and it starts the next window
    feed = RunFeed([3, 5, 8, 4], [1])
    packer, _ = window_packer(feed)
    assert fill(packer, 2) == (2, [[(0, 0, 3), (1, 0, 5)], [(2, 0, 8)]])
    assert packer.state() == {"held": []} and feed.next == 3, (
        f"an exact fit must not take another document: {packer.state()}, next {feed.next}")
    assert fill(packer, 2) == (1, [[(3, 0, 4)], []])


def _one_run_packer(size: int, schema: SampleSchema, columns: tuple[np.ndarray, ...],
                    offsets: list[int]) -> wrap.WrapPacker:
    """A wrap packer of ``size``-token sequences whose mixture hands out one run, then none."""
    runs = [Run(0, columns, offsets, len(offsets) - 1, (7, len(offsets) - 2))]
    ctx = PackContext(lambda: None, lambda s, r: None, size, schema,  # type: ignore[arg-type,return-value]
                      Counters(), Packing(algorithm="wrap"),  # type: ignore[arg-type]
                      next_run=lambda need: runs.pop() if runs else None)
    return wrap.WrapPacker(ctx)


def test_each_document_column_lands_in_its_own_column() -> None:
    """Two document columns beyond input_ids (a mask, labels): A = 3 tokens, B = 4, one row
    of 8. Each column takes its own values, positions restart at B, the last token is pad."""
    schema = text_schema(0, (Column("loss_mask", "uint8", 0), Column("labels", "int32", -100)))
    packer = _one_run_packer(SIZE, schema, (
        np.array([1000, 1001, 1002, 2000, 2001, 2002, 2003], np.int32),
        np.array([1, 0, 1, 0, 1, 1, 0], np.uint8),
        np.array([10, 11, 12, 20, 21, 22, 23], np.int32)), [0, 3, 7])
    out = {c.name: np.full((1, SIZE), 77, dtype=c.np_dtype) for c in schema}
    assert packer.fill_window(out, 1) == 1
    assert {k: v[0].tolist() for k, v in out.items()} == {
        "input_ids": [1000, 1001, 1002, 2000, 2001, 2002, 2003, 0],
        "positions": [0, 1, 2, 0, 1, 2, 3, -1],
        "loss_mask": [1, 0, 1, 0, 1, 1, 0, 0],
        "labels": [10, 11, 12, 20, 21, 22, 23, -100]}


def test_the_position_table_covers_a_row_of_the_longest_sequence() -> None:
    """seq_len at its bound (2^20) makes rows of 2^20 + 1 tokens: one document filling a row
    gets positions 0 .. 2^20, from the shared table (a view, no copy)."""
    size = MAX_SEQ_LEN + 1
    assert np.shares_memory(base.positions_of(size), base.ARANGE)
    packer = _one_run_packer(size, text_schema(0), (np.ones(size, np.int32),), [0, size])
    out = {"input_ids": np.zeros((1, size), np.int32), "positions": np.zeros((1, size), np.int32)}
    assert packer.fill_window(out, 1) == 1
    assert out["positions"][0].tolist() == list(range(size))

"""The end of the data: padding rows and ``ended``, for one lane and for a loader of lanes.

A lane whose sources are finite runs out: from the first sequence the packer cannot make, its
rows are padding (``input_ids`` = the pad id, ``positions`` = -1) and its windows say
``ended``; every later window is padding and ``ended`` too, so ranks stay in lockstep. There
is no look-ahead: a window whose rows all hold data is not ``ended``, even when nothing comes
after it (the next one is). A loader's step is ``ended`` only when every lane it serves has
ended. The documents are word-level (one token a word, EOS appended), so every token is
counted by hand below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane import Knobs, Loader, load_recipe
from datalane.engine.plan import Plan
from tests.support.stages import (
    DOC0,
    EOS,
    PAD,
    X,
    doc_ids,
    recipe_dict,
    text_of,
    write_jsonl,
    write_tokenizer,
)

SIZE = 8  # seq_len 7


@pytest.fixture
def tok(tmp_path: Path) -> str:
    return write_tokenizer(tmp_path / "tokenizer.json")


def doc(i: int, n: int) -> list[int]:
    """Tokens of document ``i`` of ``n`` words, EOS included."""
    return [DOC0 + i] + [X] * (n - 1) + [EOS]


def steps_of(recipe: Any, count: int, **loader: Any) -> tuple[list[Any], Any]:
    with Loader(recipe, knobs=Knobs(workers=2, task_docs=2), **loader) as ld:
        steps = [ld.next_step() for _ in range(count)]
        return steps, ld.counters()


def lane_recipe(tok: str, path: str, algorithm: str = "wrap", **over: Any) -> Any:
    return load_recipe(recipe_dict(tok, [{"name": "s", "uris": [path]}], seq_len=SIZE - 1,
                                   global_batch_size=2, packing={"algorithm": algorithm},
                                   **over))


def test_wrap_lane_real_tokens_then_padding_and_ended(tok: str, tmp_path: Path) -> None:
    # documents of 3, 5, 2, 6 words: 4 + 6 + 3 + 7 = 20 tokens with EOS; wrap into 8:
    #   seq 0: doc0[0:4] doc1[0:4]          seq 1: doc1[4:6] doc2[0:3] doc3[0:3]
    #   seq 2: doc3[3:7] + 4 padding        then nothing: padding rows
    path = write_jsonl(tmp_path / "a.jsonl", [text_of(i, n) for i, n in
                                              enumerate([3, 5, 2, 6])])
    steps, counters = steps_of(lane_recipe(tok, path), 4)
    d0, d1, d2, d3 = doc(0, 3), doc(1, 5), doc(2, 2), doc(3, 6)
    want_ids = [d0 + d1[:4], d1[4:] + d2 + d3[:3], d3[3:] + [PAD] * 4, [PAD] * 8]
    want_pos = [[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 0, 1, 2, 0, 1, 2],
                [0, 1, 2, 3, -1, -1, -1, -1], [-1] * 8]
    np.testing.assert_array_equal(
        np.concatenate([s.input_ids for s in steps[:2]]), want_ids,
        err_msg="the lane must emit its documents' tokens, then padding rows of the pad id")
    np.testing.assert_array_equal(
        np.concatenate([s.positions for s in steps[:2]]), want_pos,
        err_msg="positions restart at 0 at every document and sequence and are -1 on padding")
    assert [s.ended for s in steps] == [False, True, True, True], (
        "ended must be set on the first window with a padding row for lack of data and on "
        "every later one")
    for s in steps[2:]:
        assert (s.input_ids == PAD).all() and (s.positions == -1).all(), (
            "every window after the end must be all padding")
    assert counters.tokens == 20, f"the lane must emit exactly its 20 real tokens: {counters}"
    assert counters.kept == 4 and counters.docs == 4, f"4 documents read and kept: {counters}"
    assert counters.tokens + counters.padding == 4 * 2 * SIZE, (
        f"tokens + padding must add up to rows x (seq_len + 1) = {4 * 2 * SIZE}: {counters}")


def test_bestfit_lane_real_tokens_then_padding_and_ended(tok: str, tmp_path: Path) -> None:
    # the same documents, best fit into 8 (8 open sequences): 4 -> new A; 6 -> new B (A has
    # room 4); 3 -> A (room 4; B's room 2 is too small); 7 -> new C; the end flushes A, B, C
    path = write_jsonl(tmp_path / "a.jsonl", [text_of(i, n) for i, n in
                                              enumerate([3, 5, 2, 6])])
    steps, counters = steps_of(lane_recipe(tok, path, "bestfit"), 3)
    d0, d1, d2, d3 = doc(0, 3), doc(1, 5), doc(2, 2), doc(3, 6)
    want = [d0 + d2 + [PAD], d1 + [PAD] * 2, d3 + [PAD], [PAD] * 8]
    np.testing.assert_array_equal(np.concatenate([s.input_ids for s in steps[:2]]), want,
                                  err_msg="best fit must flush its open sequences oldest first")
    assert [s.ended for s in steps] == [False, True, True], (
        "ended must be set on the first window with a padding row for lack of data and on "
        "every later one (bestfit)")
    assert counters.tokens == 20 and counters.tokens + counters.padding == 3 * 2 * SIZE, (
        f"bestfit: 20 real tokens, tokens + padding = rows x (seq_len + 1): {counters}")


def test_data_ending_on_a_window_boundary_ends_the_next_window(tok: str, tmp_path: Path) -> None:
    # 4 documents of 3 words + EOS = 16 tokens: exactly one window of 2 x 8
    path = write_jsonl(tmp_path / "a.jsonl", [text_of(i, 3) for i in range(4)])
    steps, counters = steps_of(lane_recipe(tok, path), 3)
    assert doc_ids(steps[0].input_ids) == [0, 1, 2, 3], "the first window holds the 4 documents"
    assert (steps[0].positions >= 0).all(), "the first window is all real tokens"
    assert [s.ended for s in steps] == [False, True, True], (
        "a window whose rows all hold data is not ended; the next one (all padding) is")
    assert (steps[1].positions == -1).all(), "the window after the data is all padding"
    assert counters.tokens == 16 and counters.padding == 2 * 2 * SIZE, (
        f"16 real tokens, then one window of padding: {counters}")


def test_two_epochs_count_every_token_twice(tok: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [text_of(i, n) for i, n in
                                              enumerate([3, 5, 2, 6])])
    recipe = load_recipe(recipe_dict(tok, [{"name": "s", "uris": [path], "epochs": 2}],
                                     seq_len=SIZE - 1, global_batch_size=2))
    steps, counters = steps_of(recipe, 4)
    # 40 tokens: 5 full sequences, then 0 real tokens: rows 0-4 data, row 5 padding
    assert [s.ended for s in steps] == [False, False, True, True], (
        "a source of 2 epochs must end after its second epoch, on the window that pads")
    assert counters.tokens == 40 and counters.kept == 8, (
        f"2 epochs must emit every token and document twice: {counters}")
    assert counters.tokens + counters.padding == 4 * 2 * SIZE, (
        f"tokens + padding must add up to rows x (seq_len + 1): {counters}")
    assert (steps[2].positions[1] == -1).all() and (steps[2].positions[0] >= 0).all(), (
        "the 5th sequence is data, the 6th padding")


def test_an_ended_lane_stays_ended_after_a_restore(tok: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [text_of(i, n) for i, n in
                                              enumerate([3, 5, 2, 6])])
    recipe = lane_recipe(tok, path)
    with Loader(recipe, knobs=Knobs(workers=1)) as ld:
        for _ in range(2):
            ld.next_step()
        state = ld.state_dict()
    with Loader(recipe, knobs=Knobs(workers=1)) as ld:
        ld.load_state_dict(state)
        step = ld.next_step()
        assert step.ended and (step.positions == -1).all(), (
            "a lane restored after it ended must stay ended, with padding rows")
        assert ld.counters().tokens == 20, "restored counters keep the lane's real tokens"


def test_a_loader_step_ends_only_when_all_its_lanes_ended(tok: str, tmp_path: Path) -> None:
    # two lanes, one file each: 2 documents (8 tokens, 1 sequence) and 8 (32 tokens, 4)
    a = write_jsonl(tmp_path / "a.jsonl", [text_of(i, 3) for i in range(2)])
    b = write_jsonl(tmp_path / "b.jsonl", [text_of(100 + i, 3) for i in range(8)])
    recipe = load_recipe(recipe_dict(tok, [{"name": "s", "uris": [a, b]}], lanes=2,
                                     global_batch_size=4, seq_len=SIZE - 1))
    plan = Plan.build(recipe)
    [sp] = plan.sources
    short = 0 if sp.lane_chunks(0, 0)[0].file == 0 else 1  # the lane that reads a.jsonl
    lane_ended = {}
    for lane in range(2):
        steps, _ = steps_of(recipe, 4, rank=lane, world_size=2, plan=plan)
        lane_ended[lane] = [s.ended for s in steps]
    # 2 rows per lane and step: the short lane pads from row 1 of step 0; the long one has
    # 4 sequences = 2 full windows and ends at step 2
    assert lane_ended[short] == [True] * 4, (
        f"the lane with one sequence must be ended from its first window: {lane_ended}")
    assert lane_ended[1 - short] == [False, False, True, True], (
        f"the lane with 4 sequences (2 windows) must end on its third window: {lane_ended}")
    steps, counters = steps_of(recipe, 4, plan=plan)
    assert [s.ended for s in steps] == [False, False, True, True], (
        "a loader's step must be ended only when every one of its lanes has ended")
    short_rows, long_rows = (slice(2 * k, 2 * k + 2) for k in (short, 1 - short))
    assert (steps[1].positions[short_rows] == -1).all(), (
        "an ended lane's rows are padding inside a step its loader has not ended")
    assert (steps[1].positions[long_rows] >= 0).all(), "the other lane's rows hold data"
    assert counters.tokens == 40 and counters.tokens + counters.padding == 4 * 4 * SIZE, (
        f"a loader's counters add its lanes' tokens and padding: {counters}")
    with Loader(recipe, knobs=Knobs(workers=1), plan=plan) as ld:
        micro = [m for _, m in zip(range(8), ld.microbatches(2), strict=False)]
    assert [m.ended for m in micro] == [s.ended for s in steps for _ in range(2)], (
        "every microbatch carries its step's ended")

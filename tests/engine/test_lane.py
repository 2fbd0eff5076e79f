"""One lane's windows, its padding once the data ends, and its resume point (engine/lane.py).

The source is countable by hand (tests/support/stages.py: ``"d<i> x x"`` is the tokens
``[DOC0 + i, 4, 4]``, then EOS 1): documents of 4 tokens, one lane of 2 rows of 8 tokens a
step (``seq_len`` 7), ``wrap`` packing, shuffle blocks of one record, one epoch. Every window
below is written out token by token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from datalane import load_recipe
from datalane.engine.lane import LaneStream
from datalane.engine.lanecheck import FRESH
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import MismatchError
from datalane.spec.knobs import Knobs
from datalane.spec.state import Counters, LaneState, PackerState
from tests.support.stages import (
    DOC0,
    EOS,
    PAD,
    X,
    recipe_dict,
    text_of,
    write_jsonl,
    write_tokenizer,
)

PADDING = [PAD] * 8
NO_POSITIONS = [-1] * 8


def doc(i: int) -> list[int]:
    return [DOC0 + i, X, X, EOS]


@pytest.fixture(scope="module")
def pool() -> Iterator[TaskPool]:
    with TaskPool(1) as p:
        yield p


def plan_of(d: Path, docs: int, **over: Any) -> Plan:
    tok = write_tokenizer(d / "tokenizer.json")
    a = write_jsonl(d / "a.jsonl", [text_of(i, 3) for i in range(docs)])
    sources = [{"name": "a", "uris": [a]}, *over.pop("more", [])]
    return Plan.build(load_recipe(recipe_dict(tok, sources, global_batch_size=2, **over)))


def lane(plan: Plan, pool: TaskPool, bulk: bool = True,
         state: LaneState | None = None) -> LaneStream:
    stream = LaneStream(plan, 0, plan.map_stages(), pool, Knobs(workers=1), state)
    if not bulk:
        stream._fill = None  # the sequence-by-sequence path
    return stream


@pytest.mark.parametrize(("packer", "one_by_one"), [("wrap", False), ("wrap", True),
                                                    ("bestfit", False)])
def test_a_lanes_windows_then_padding_once_its_data_ends(tmp_path: Path, pool: TaskPool,
                                                         packer: str, one_by_one: bool) -> None:
    # 3 documents, 12 tokens: row 0 holds d0 and d1, row 1 d2 and 4 padding tokens (bestfit
    # too: every document fits whole); the next windows are all padding, ended. Only wrap
    # fills whole windows at once.
    stream = lane(plan_of(tmp_path, 3, packing={"algorithm": packer}), pool, not one_by_one)
    bulk = stream._fill is not None
    assert bulk == (packer == "wrap" and not one_by_one)
    w0 = stream.next_window()
    assert w0.input_ids.tolist() == [doc(0) + doc(1), doc(2) + [PAD] * 4]
    assert w0.positions.tolist() == [[0, 1, 2, 3] * 2, [0, 1, 2, 3] + [-1] * 4]
    assert (w0.lane, w0.ended, stream.sequences, stream.step) == (0, False, 2, 1)
    assert w0.placed == []  # text documents carry nothing beside their tokens
    # a whole-window packer knows the trained targets: 12 tokens less one per row
    assert w0.trained == (10 if bulk else None)
    assert stream.counters == Counters(docs=3, kept=3, tokens=12, padding=4)
    w1 = stream.next_window()
    assert w1.input_ids.tolist() == [PADDING] * 2 and w1.positions.tolist() == [NO_POSITIONS] * 2
    assert w1.ended and stream.ended and stream.step == 2
    assert w1.trained == (0 if bulk else None)  # (one by one: found ended inside the window)
    w2 = stream.next_window()
    assert w2.ended and w2.trained == 0 and w2.placed == []
    assert stream.counters == Counters(docs=3, kept=3, tokens=12, padding=4 + 16 + 16)
    state = stream.state()
    assert (state.lane, state.sequences, state.ended, state.mixture) == (0, 6, True, (12,))
    assert state.mixture_base is None  # a recipe without phases writes none
    assert w0.digest != w1.digest and w1.digest == w2.digest  # padding hashes alike
    stream.close()


@pytest.mark.parametrize("bulk", [True, False])
def test_a_lane_resumed_from_its_state_continues_it(tmp_path: Path, pool: TaskPool,
                                                    bulk: bool) -> None:
    plan = plan_of(tmp_path, 6)  # 24 tokens: a full window, then 8 tokens and padding
    first = lane(plan, pool, bulk)
    w0 = first.next_window()
    assert w0.input_ids.tolist() == [doc(0) + doc(1), doc(2) + doc(3)]
    saved = first.state()
    assert (saved.sequences, saved.ended, saved.counters.padding) == (2, False, 0)
    resumed = lane(plan, pool, bulk, saved)
    assert (resumed.sequences, resumed.step, resumed.ended) == (2, 1, False)
    w1 = resumed.next_window()
    assert w1.input_ids.tolist() == [doc(4) + doc(5), PADDING]
    assert w1.ended  # its second row found no data
    assert resumed.counters == Counters(docs=6, kept=6, tokens=24, padding=8)
    first.next_window()
    assert resumed.state() == first.state()  # the same resume point as the lane that ran on
    first.close()
    resumed.close()


B_LATER = {"name": "b-in", "start_step": 50, "weights": {"b": 1.0}}


def test_a_source_added_after_the_others_joins_fresh(tmp_path: Path, pool: TaskPool) -> None:
    """A state saved before source ``b`` existed resumes on the recipe that adds it (weight 0
    until a phase that has not begun): ``b`` at its first record, 0 of its tokens consumed, and
    the mixture's re-basing values extended with zeros."""
    a_up = {"name": "a-up", "start_step": 40, "weights": {"a": 2.0}}
    (tmp_path / "before").mkdir()
    before = plan_of(tmp_path / "before", 6, phases=[a_up])
    first = lane(before, pool)
    first.next_window()
    saved = first.state()
    assert len(saved.sources) == 1 and saved.mixture == (16,)
    assert saved.mixture_base is not None and len(saved.mixture_base.passes) == 1
    (tmp_path / "after").mkdir()
    b = write_jsonl(tmp_path / "after" / "b.jsonl", [text_of(100, 3)])
    after = plan_of(tmp_path / "after", 6, phases=[a_up, B_LATER],
                    more=[{"name": "b", "uris": [b], "weight": 0}])
    resumed = lane(after, pool, state=saved)
    w1 = resumed.next_window()
    assert w1.input_ids.tolist() == [doc(4) + doc(5), PADDING]  # b has weight 0 until 50
    state = resumed.state()
    assert state.sources[1] == FRESH and state.mixture == (24, 0)
    assert state.mixture_base == saved.mixture_base.extended(2)
    first.close()
    resumed.close()


def test_a_lane_checks_the_state_it_resumes_from(tmp_path: Path, pool: TaskPool) -> None:
    """The lane refuses a state it could not have written (engine/lanecheck.py, one rule a
    test there) before building anything from it."""
    plan = plan_of(tmp_path, 6)
    first = lane(plan, pool)
    first.next_window()
    saved = first.state()
    first.close()
    with pytest.raises(MismatchError) as info:
        lane(plan, pool, state=dataclasses.replace(saved, lane=1))
    assert str(info.value) == "the state of lane 1 cannot restore lane 0"


@pytest.mark.parametrize(("start", "cut"), [(2, 1), (2, 2), (2, 3), (1, 1)])
def test_a_lane_resumed_around_a_weight_change_continues_as_it_would_have(
        tmp_path: Path, pool: TaskPool, start: int, cut: int) -> None:
    """The mixture of a resumed lane starts from the weights of the state's last window (step
    ``cut - 1``) and re-bases at the change as the lane that ran on did: ``b`` joins at step
    ``start`` with 3 times ``a``'s weight, and every window after the resume point is the
    same."""
    b = write_jsonl(tmp_path / "b.jsonl", [text_of(100 + i, 3) for i in range(12)])
    plan = plan_of(tmp_path, 12, more=[{"name": "b", "uris": [b], "weight": 0}],
                   phases=[{"name": "b-in", "start_step": start, "weights": {"b": 3.0}}])
    ran = lane(plan, pool)
    windows, states = [], []
    for _ in range(6):
        windows.append(ran.next_window().input_ids.tolist())
        states.append(ran.state())
    ran.close()
    a_only = [[doc(0) + doc(1), doc(2) + doc(3)], [doc(4) + doc(5), doc(6) + doc(7)]]
    assert windows[:start] == a_only[:start]  # a alone before the phase, b from it on
    assert any(DOC0 + 100 in row for row in windows[start])
    resumed = lane(plan, pool, state=states[cut - 1])
    for step in range(cut, 6):
        assert resumed.next_window().input_ids.tolist() == windows[step], f"step {step}"
    assert resumed.state() == states[-1]
    resumed.close()


def test_a_source_counts_as_run_out_when_its_cursor_is_past_its_last_epoch(
        tmp_path: Path, pool: TaskPool) -> None:
    """What the lane tells the mixture's re-basing (``ran_out``): the resume point's epoch,
    the same in a run and in its restore; a repeating source never runs out."""
    b = write_jsonl(tmp_path / "b.jsonl", [text_of(100, 3)])
    plan = plan_of(tmp_path, 3, more=[{"name": "b", "uris": [b], "epochs": None}])
    stream = lane(plan, pool)
    assert [stream._ran_out(0), stream._ran_out(1)] == [False, False]
    for _ in range(3):
        stream.next_window()
    assert stream.streams[0].cursor.epoch == 1  # a read once: epoch 1 of 1
    assert stream.streams[1].cursor.epoch >= 1  # b has come round at least once
    assert [stream._ran_out(0), stream._ran_out(1)] == [True, False]
    restored = lane(plan, pool, state=stream.state())
    assert [restored._ran_out(0), restored._ran_out(1)] == [True, False]
    stream.close()
    restored.close()


def test_a_carried_piece_resumes_and_one_the_recipe_cannot_hold_is_refused(
        tmp_path: Path, pool: TaskPool) -> None:
    """Documents of 5 tokens (``"d<i> x x x"`` and EOS): window 0 ends 1 token into d3, so
    the state carries d3's tokens 1..5 (source 0, the document at byte 63: three lines of
    21 bytes before it). A piece of a source or document the recipe does not have is refused
    naming it (a chunk 9 of a one-chunk source)."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    a = write_jsonl(tmp_path / "a.jsonl", [text_of(i, 4) for i in range(6)])
    plan = Plan.build(load_recipe(recipe_dict(tok, [{"name": "a", "uris": [a]}],
                                              global_batch_size=2)))
    first = lane(plan, pool)
    five = [[DOC0 + i, X, X, X, EOS] for i in range(6)]
    assert first.next_window().input_ids.tolist() == [five[0] + five[1][:3],
                                                      five[1][3:] + five[2] + five[3][:1]]
    saved = first.state()
    first.close()
    assert saved.packer == PackerState("wrap", {"held": [[0, [0, 63], 1, 5]]})
    resumed = lane(plan, pool, state=saved)
    assert resumed.next_window().input_ids.tolist() == [five[3][1:] + five[4][:4],
                                                        five[4][4:] + five[5] + [PAD] * 2]
    resumed.close()
    for piece, named in (([1, [0, 63], 1, 5], "source 1, document [0, 63]"),
                         ([0, [9, 0], 1, 5], "source 0, document [9, 0]")):
        with pytest.raises(MismatchError) as info:
            lane(plan, pool, state=dataclasses.replace(
                saved, packer=PackerState("wrap", {"held": [piece]}))).next_window()
        assert str(info.value) == (f"lane 0 state: carried piece of {named}, is not a "
                                   f"document of the recipe")

"""The checks of a lane's resume point against the plan (engine/lanecheck.py), one rule a test.

The plan is real and small enough to count by hand: source ``a`` (weight 1, repeating) is one
JSONL file of 8 lines cut into 4 chunks of 32 bytes, source ``b`` (weight 0 until the phase
``b-in`` at step 2, one epoch) one of 5 lines cut into 3 chunks. Two lanes: lane 0 reads 2
chunks of ``a`` and 2 of ``b`` per epoch. Blocks of 4 records, 2 sequences of 8 tokens per
lane and step. The states are built directly, so each test changes one field of a state the
lane could have written and names the message the check must give.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from datalane import load_recipe
from datalane.engine.lanecheck import FRESH, check_lane_state
from datalane.engine.plan import Plan
from datalane.spec.errors import MismatchError
from datalane.spec.phases import Schedule
from datalane.spec.state import Counters, LaneState, PackerState, SourceCursor
from tests.support.stages import recipe_dict, write_jsonl, write_tokenizer

SEQ = 8  # tokens per sequence
STEP = 2  # sequences per lane and step


def build(d: Path, a: dict[str, Any], b: dict[str, Any], phase: dict[str, float]) -> Plan:
    tok = write_tokenizer(d / "tokenizer.json")
    a_uri = write_jsonl(d / "a.jsonl", [f"d{i}" for i in range(10, 18)])  # 16-byte lines
    b_uri = write_jsonl(d / "b.jsonl", [f"d{i}" for i in range(20, 25)])
    recipe = load_recipe(recipe_dict(
        tok, [{"name": "a", "uris": [a_uri], "chunk_bytes": 32, **a},
              {"name": "b", "uris": [b_uri], "chunk_bytes": 32, **b}],
        lanes=2, global_batch_size=2 * STEP, seq_len=SEQ - 1, shuffle={"block_size": 4},
        phases=[{"name": "b-in", "start_step": 2, "weights": phase}]))
    built = Plan.build(recipe)
    assert [len(sp.lane_chunks(0, 0)) for sp in built.sources] == [2, 2]
    return built


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    return build(tmp_path_factory.mktemp("lanecheck"), {"epochs": None},
                 {"epochs": 1, "weight": 0.0}, {"b": 1.0})


@pytest.fixture(scope="module")
def finite(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """Both sources of one epoch and weight 1; from step 2 on ``a`` has weight 0."""
    return build(tmp_path_factory.mktemp("lanecheck-finite"), {"epochs": 1}, {"epochs": 1},
                 {"a": 0.0})


def lane_state(step: int = 1, **changes: Any) -> LaneState:
    """Lane 0 at ``step``: 3 records of ``a``'s first block read (9 tokens), ``b`` fresh, the
    sequences' tokens split between documents and padding."""
    sequences = step * STEP
    base = LaneState(0, sequences, (SourceCursor(0, 0, 0, -1, 3), FRESH), (9, 0),
                     PackerState.empty(), False,
                     Counters(docs=3, kept=3, tokens=sequences * SEQ - 4, padding=4))
    return dataclasses.replace(base, **changes)


def refusal(plan: Plan, state: LaneState) -> str:
    with pytest.raises(MismatchError) as info:
        check_lane_state(plan, 0, state, Schedule.of(plan.recipe))
    return str(info.value)


def test_a_state_the_lane_could_have_written_passes(plan: Plan) -> None:
    """The base state of these tests is accepted: every refusal below is the one edit's."""
    check_lane_state(plan, 0, lane_state(), Schedule.of(plan.recipe))
    check_lane_state(plan, 0, lane_state(3, sources=(SourceCursor(0, 0, 1, 2, 3),
                                                     SourceCursor(0, 0, 1, 2, 0))),
                     Schedule.of(plan.recipe))


def test_the_state_of_another_lane_is_refused(plan: Plan) -> None:
    """A lane restores only its own state."""
    assert refusal(plan, lane_state(lane=1)) == "the state of lane 1 cannot restore lane 0"


def test_a_source_without_weight_so_far_must_be_unread(plan: Plan) -> None:
    """Before its phase (step 2) ``b`` has weight 0: a cursor moved from the start is
    refused even with no tokens counted (a state at step 1 consumed step 0 only)."""
    moved = SourceCursor(0, 0, 0, -1, 1)
    assert refusal(plan, lane_state(1, sources=(SourceCursor(0, 0, 0, -1, 3), moved))) == (
        "lane 0 state: source 1 'b' has weight 0 before step 1, but the state has read from "
        "it (cursor [0, 0, 0, -1, 1], 0 tokens)")


def test_a_source_without_weight_so_far_must_have_no_tokens(plan: Plan) -> None:
    """Its mixture counter must be 0 too, even with a fresh cursor."""
    assert refusal(plan, lane_state(1, mixture=(9, 5))) == (
        "lane 0 state: source 1 'b' has weight 0 before step 1, but the state has read from "
        "it (cursor [0, 0, 0, -1, 0], 5 tokens)")


def test_a_source_added_for_a_phase_not_begun_may_be_missing(plan: Plan) -> None:
    """A state written before ``b`` was appended to the recipe has one cursor and one
    counter: accepted while ``b`` has had no weight."""
    state = lane_state(2, sources=(SourceCursor(0, 0, 0, -1, 3),), mixture=(9,))
    check_lane_state(plan, 0, state, Schedule.of(plan.recipe))


def test_a_missing_source_that_had_weight_is_refused(plan: Plan) -> None:
    """At step 3 ``b`` has been in the mixture for a step: its cursor cannot be missing."""
    state = lane_state(3, sources=(SourceCursor(0, 0, 0, -1, 3),), mixture=(9,))
    assert refusal(plan, state) == (
        "lane 0 state has 1 source cursors; the recipe has 2 sources")


def test_more_sources_than_the_recipe_has_are_refused(plan: Plan) -> None:
    state = lane_state(1, sources=(SourceCursor(0, 0, 0, -1, 3), FRESH, FRESH),
                       mixture=(9, 0, 0))
    assert refusal(plan, state) == "lane 0 state has 3 source cursors; the recipe has 2 sources"


def test_cursors_and_counters_must_be_as_many(plan: Plan) -> None:
    """One cursor per mixture counter, even where either count alone would be accepted."""
    assert refusal(plan, lane_state(1, mixture=(9,))) == (
        "lane 0 state has 2 source cursors but 1 mixture counters")


def test_a_state_between_two_steps_is_refused(plan: Plan) -> None:
    """A lane saves at step boundaries: 3 sequences are not a whole number of steps of 2."""
    state = lane_state(1, sequences=3, counters=Counters(docs=3, kept=3, tokens=20, padding=4))
    assert refusal(plan, state) == (
        "lane 0 state is 3 sequences in, not on a step boundary of 2 sequences")


@pytest.mark.parametrize("cursor", [
    SourceCursor(-1, 0, 0, -1, 0),  # no epoch before the first
    SourceCursor(0, -1, 0, -1, 0),
    SourceCursor(0, 0, -1, -1, 0),
    SourceCursor(0, 0, 0, -2, 0),  # -1 is "the start of the chunk", -2 nothing
    SourceCursor(0, 0, 0, -1, -1),
    SourceCursor(0, 0, 2, 0, 0),  # lane 0 has chunks 0 and 1 of the epoch
    SourceCursor(0, 0, 0, -1, 4),  # a block holds offsets 0 .. 3
], ids=["epoch", "block", "chunk", "pos", "offset", "chunk past", "offset past"])
def test_a_cursor_outside_the_lanes_chunks_or_block_is_refused(
        plan: Plan, cursor: SourceCursor) -> None:
    state = lane_state(1, sources=(cursor, FRESH))
    assert refusal(plan, state) == (
        f"lane 0 state: cursor {cursor.encode()} of source 0 points outside the source")


# -- the end flag ----------------------------------------------------------------------------

EXHAUSTED = SourceCursor(1, 0, 0, -1, 0)  # a source of one epoch, run out


def test_an_end_flag_is_refused_while_a_repeating_source_has_weight(plan: Plan) -> None:
    """A source that repeats forever (epochs null) never runs out: a lane that reads it with
    a weight cannot have ended."""
    state = lane_state(1, ended=True)
    assert refusal(plan, state) == (
        "lane 0 state is marked ended (end: 1), but source 0 'a' (weight 1) has not run out: "
        "cursor [0, 0, 0, -1, 3], and it repeats forever (epochs null)")


def test_an_end_flag_counts_only_sources_of_positive_weight(finite: Plan) -> None:
    """At step 3 the phase of step 2 has begun: under its weights ``a`` (weight 0) is out
    of the race, so ``b`` run out ends the lane although ``a`` has records left."""
    state = lane_state(3, ended=True, sources=(SourceCursor(0, 0, 0, -1, 3), EXHAUSTED))
    check_lane_state(finite, 0, state, Schedule.of(finite.recipe))


def test_an_end_flag_counts_only_phases_begun_before_the_states_step(finite: Plan) -> None:
    """A state at step 2 consumed steps 0 and 1 only: the phase starting at step 2 has not
    taken ``a`` out yet, so ``a`` with records left keeps the lane alive."""
    state = lane_state(2, ended=True, sources=(SourceCursor(0, 0, 0, -1, 3), EXHAUSTED))
    assert refusal(finite, state) == (
        "lane 0 state is marked ended (end: 1), but source 0 'a' (weight 1) has not run out: "
        "cursor [0, 0, 0, -1, 3], epoch 0 of 1")

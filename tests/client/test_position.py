"""The client's state_dict (datalane.client/v2): round trip, v1 states, and every refusal.

The states are written out by hand: the v1 ones are copied from what the v1 client wrote
(``InProcessLoader.state_dict()`` of a one-lane recipe, the nested checkpoint's fingerprint
document trimmed - the position never reads inside the lane states).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from datalane.client.position import Position
from datalane.spec.errors import ConfigError, MismatchError

FP = "8b7b1b2927602072fdff33f8f623deb62b99c4146034c3d767c833271f9e054a"

# the lane states of a one-lane recipe at step 1, as the engine wrote them
CHECKPOINT: dict[str, Any] = {
    "format": "datalane.checkpoint/v1", "step": 1, "fingerprint": FP, "lanes_total": 1,
    "lanes": {"0": {"v": 1, "lane": 0, "seqs": 2, "src": [[0, 0, 0, 0, 1], [0, 0, 0, -1, 0]],
                    "mix": [1078, 0], "carry": [[[0, 0, 2, 258, 1078]]],
                    "n": [1, 1, 258, 0, {}]}},
    "fingerprint_doc": {"recipe": {"lanes": 1}},
    "sha256": "0cb1b709b535983fb32174650d2e0c16f6f1a0a1463b8f2937549a913a61b87e",
}

# v1, as the client wrote it before this change: at the start, and one microbatch into step 1
V1_START: dict[str, Any] = {"format": "datalane.client/v1", "step": 0, "consumed": 0,
                            "fingerprint": FP, "state": None, "world_size": 1,
                            "microbatch_size": 1}
V1_MID: dict[str, Any] = {"format": "datalane.client/v1", "step": 1, "consumed": 1,
                          "fingerprint": FP, "state": CHECKPOINT, "world_size": 1,
                          "microbatch_size": 1}
# v1 of the first clients, before world_size and microbatch_size were recorded
V1_FIRST: dict[str, Any] = {"format": "datalane.client/v1", "step": 1, "consumed": 1,
                            "fingerprint": FP, "state": CHECKPOINT}

V2_MID: dict[str, Any] = {"format": "datalane.client/v2", "step": 1, "consumed": 1,
                          "fingerprint": FP, "world_size": 1, "microbatch_size": 1,
                          "state": CHECKPOINT}

COMPACT = json.dumps(CHECKPOINT, separators=(",", ":"))


def _fields(p: Position) -> tuple[Any, ...]:
    return (p.step, p.consumed, p.state_json, p.fingerprint, p.world_size, p.microbatch_size)


# -- v2 ---------------------------------------------------------------------------------------

def test_a_position_is_written_as_v2_with_every_key() -> None:
    pos = Position(step=1, consumed=1, state_json=COMPACT, fingerprint=FP, world_size=1,
                   microbatch_size=1)
    assert pos.to_state() == V2_MID
    assert Position().to_state() == {"format": "datalane.client/v2", "step": 0, "consumed": 0,
                                     "fingerprint": "", "world_size": 0, "microbatch_size": 0,
                                     "state": None}


def test_v2_round_trips_through_json() -> None:
    pos = Position(step=7, consumed=3, state_json=COMPACT, fingerprint=FP, world_size=4,
                   microbatch_size=2)
    back = Position.from_state(json.loads(json.dumps(pos.to_state())))
    assert _fields(back) == (7, 3, COMPACT, FP, 4, 2)
    assert back.to_state() == pos.to_state()


# -- advancing ----------------------------------------------------------------------------------

def test_a_microbatch_inside_a_step_counts_as_consumed() -> None:
    pos = Position(step=1, consumed=0, state_json="A")
    pos.advance(1, 0, 3, "B")  # microbatch 0 of 3
    assert (pos.step, pos.consumed, pos.state_json) == (1, 1, "A")
    pos.advance(1, 1, 3, "B")
    assert (pos.step, pos.consumed, pos.state_json) == (1, 2, "A")


def test_the_last_microbatch_of_a_step_moves_to_the_next_boundary_and_its_state() -> None:
    pos = Position(step=1, consumed=2, state_json="A")
    pos.advance(1, 2, 3, "B")  # microbatch 2 of 3: step 1 is done
    assert (pos.step, pos.consumed, pos.state_json) == (2, 0, "B")
    pos.advance(2, 0, 1, None)  # a boundary reached with no state: the last one is kept
    assert (pos.step, pos.consumed, pos.state_json) == (3, 0, "B")


# -- v1 ---------------------------------------------------------------------------------------

def test_v1_states_as_the_v1_client_wrote_them_still_load() -> None:
    assert _fields(Position.from_state(V1_START)) == (0, 0, None, FP, 1, 1)
    mid = Position.from_state(json.loads(json.dumps(V1_MID)))
    assert _fields(mid) == (1, 1, COMPACT, FP, 1, 1)
    assert mid.to_state() == V2_MID  # and are saved again as v2


def test_v1_states_of_the_first_clients_load_with_an_unknown_layout() -> None:
    first = Position.from_state(V1_FIRST)
    assert _fields(first) == (1, 1, COMPACT, FP, 0, 0)
    first.check_layout(8, 4)  # an unknown layout is not refused inside a step


def test_a_v1_state_of_only_its_format_and_step_is_at_that_step_with_nothing_known() -> None:
    assert _fields(Position.from_state({"format": "datalane.client/v1", "step": 5})) == (
        5, 0, None, "", 0, 0)


# -- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("state", [V2_MID, V1_MID])
def test_an_unknown_key_is_refused_naming_it(state: dict[str, Any]) -> None:
    with pytest.raises(MismatchError, match=r"client state\.stepp is not a known key; did you "
                                            r"mean 'step'\?"):
        Position.from_state({**state, "stepp": 3})


@pytest.mark.parametrize("key", ["step", "consumed", "fingerprint", "world_size",
                                 "microbatch_size", "state"])
def test_v2_requires_every_key(key: str) -> None:
    with pytest.raises(MismatchError, match=rf"client state\.{key} is required"):
        Position.from_state({k: v for k, v in V2_MID.items() if k != key})


def test_v1_requires_the_step() -> None:
    with pytest.raises(MismatchError, match=r"client state\.step is required"):
        Position.from_state({k: v for k, v in V1_MID.items() if k != "step"})


@pytest.mark.parametrize(("data", "message"), [
    ({**V2_MID, "format": "datalane.client/v3"},
     r"not a datalane client state \(format 'datalane.client/v3', expected "
     r"'datalane.client/v2' or 'datalane.client/v1'\)"),
    ({k: v for k, v in V2_MID.items() if k != "format"}, r"\(format None, expected"),
    ({**V2_MID, "format": ["datalane.client/v2"]}, r"\(format \['datalane.client/v2'\]"),
    ([V2_MID], r"not a datalane client state: expected an object, got list"),
    (None, r"expected an object, got NoneType"),
])
def test_what_is_not_a_client_state_is_refused(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        Position.from_state(data)


BAD_VALUES = [
    ("step", -1, r"client state\.step -1 must be >= 0"),
    ("step", 10**12, r"client state\.step 1000000000000 must be <= 999999999999"),
    ("step", True, r"client state\.step must be an integer, got True"),
    ("step", 1.0, r"client state\.step must be an integer, got 1\.0"),
    ("step", "1", r"client state\.step must be an integer, got '1'"),
    ("step", None, r"client state\.step must be integer, got null"),
    ("consumed", -1, r"client state\.consumed -1 must be >= 0"),
    ("consumed", 2**31, r"client state\.consumed 2147483648 must be <= 2147483647"),
    ("consumed", True, r"client state\.consumed must be an integer, got True"),
    ("consumed", None, r"client state\.consumed must be integer, got null"),
    ("fingerprint", "abc", r"client state\.fingerprint 'abc' does not match the pattern"),
    ("fingerprint", FP.upper(), rf"client state\.fingerprint '{FP.upper()}' does not match"),
    ("fingerprint", 5, r"client state\.fingerprint must be a string, got 5"),
    ("world_size", -2, r"client state\.world_size -2 must be >= 0"),
    ("world_size", 2**31, r"client state\.world_size 2147483648 must be <= 2147483647"),
    ("world_size", False, r"client state\.world_size must be an integer, got False"),
    ("microbatch_size", -1, r"client state\.microbatch_size -1 must be >= 0"),
    ("microbatch_size", 1.5, r"client state\.microbatch_size must be an integer, got 1\.5"),
    ("state", [1], r"client state\.state: the lane states must be an object or null, got "
                   r"list \[1\]"),
    ("state", "{}", r"client state\.state: the lane states must be an object or null, got "
                    r"str '\{\}'"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_VALUES)
@pytest.mark.parametrize("base", [V2_MID, V1_MID], ids=["v2", "v1"])
def test_a_bad_value_is_refused_naming_the_field_and_the_value(
        base: dict[str, Any], key: str, value: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        Position.from_state({**base, key: value})


@pytest.mark.parametrize(("value", "shown"), [
    ("x" * 78, "'" + "x" * 78 + "'"),  # a repr of 80 characters is shown whole
    ("x" * 79, "'" + "x" * 76 + "..."),  # one of 81 is cut to 77 and "..."
])
def test_a_long_bad_value_is_shown_cut_to_80_characters(value: str, shown: str) -> None:
    with pytest.raises(MismatchError) as e:
        Position.from_state({**V2_MID, "state": value})
    assert str(e.value) == ("client state.state: the lane states must be an object or null, "
                            f"got str {shown}")


# -- consumed against the layout ----------------------------------------------------------------

def test_consumed_must_be_inside_a_step_of_the_layout() -> None:
    pos = Position.from_state({**V2_MID, "consumed": 4, "world_size": 2, "microbatch_size": 2})
    pos.check_layout(2, 2, per_step=5)  # 4 of 5 consumed: inside the step
    pos.check_layout(2, 2)  # per_step 0: not known yet (a sidecar client before its Open)
    for per_step in (4, 3):
        with pytest.raises(ConfigError, match=rf"consumed 4 microbatches of step 1, but a step "
                                              rf"has {per_step} at world size 2 and microbatch "
                                              rf"size 2: consumed must be below {per_step}"):
            pos.check_layout(2, 2, per_step=per_step)
    # at a step boundary any layout and step size fit
    Position.from_state({**V2_MID, "consumed": 0}).check_layout(8, 1, per_step=1)


def test_a_position_inside_a_step_refuses_another_layout() -> None:
    pos = Position.from_state({**V2_MID, "consumed": 3, "world_size": 2, "microbatch_size": 2})
    pos.check_layout(2, 2)
    with pytest.raises(ConfigError, match=r"inside step 1 \(3 microbatches of 2 sequences "
                                          r"consumed at world size 2\).*not world size 4 and "
                                          r"microbatch size 2"):
        pos.check_layout(4, 2, per_step=8)


def test_the_in_process_loader_refuses_a_consumed_count_past_its_step(make_recipe) -> None:
    """A state whose ``consumed`` is not inside a step of this layout used to start silently
    at a later microbatch of the next step (step 1, consumed 9 of 8 -> step 2, microbatch 1)."""
    from datalane.client import InProcessLoader

    recipe = make_recipe()
    ld = InProcessLoader(recipe, rank=0, world_size=1, microbatch_size=2)
    try:
        it = iter(ld)
        for _ in range(ld.per_step + 3):
            next(it)
        state = ld.state_dict()
    finally:
        ld.close()
    assert state["consumed"] == 3
    bad = {**state, "consumed": ld.per_step}
    again = InProcessLoader(recipe, rank=0, world_size=1, microbatch_size=2)
    try:
        with pytest.raises(ConfigError, match=rf"consumed {ld.per_step} microbatches of step "
                                              rf"1"):
            again.load_state_dict(bad)
    finally:
        again.close()

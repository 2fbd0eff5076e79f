"""The per-lane form of a client state (what DCP saves): keys, re-dealing and refusals."""

from __future__ import annotations

import json

import pytest

from datalane import MismatchError
from datalane.client import InProcessLoader
from datalane.client.lanekeys import RECIPE_KEY, join, lane_key, split
from datalane.client.position import CLIENT_STATE_FORMAT
from datalane.spec.integrity import SEAL_KEY, seal
from datalane.spec.state import CHECKPOINT_FORMAT, checkpoint_sha256


def _states(recipe, world: int, microbatches: int) -> list[dict]:
    out = []
    for rank in range(world):
        loader = InProcessLoader(recipe, rank, world, 2)
        it = iter(loader)
        for _ in range(microbatches):
            next(it)
        out.append(loader.state_dict())
        loader.close()
    return out


def test_split_names_one_entry_per_owned_lane(make_recipe) -> None:
    recipe = make_recipe()  # 8 lanes
    state = _states(recipe, 2, 8)[1]  # rank 1 of 2 owns lanes 4-7; 8 microbatches = 2 steps
    entries = split(state, range(4, 8), 8)
    assert sorted(entries) == ["lane_00004", "lane_00005", "lane_00006", "lane_00007",
                               "recipe"]
    body = json.loads(entries["lane_00005"])
    assert (body["lane"], body["step"], body["consumed"], body["world_size"]) == (5, 2, 0, 2)
    assert body["state"] == state["state"]["lanes"]["5"]


def test_entries_of_two_ranks_join_into_the_state_of_one(make_recipe) -> None:
    recipe = make_recipe()
    a, b = _states(recipe, 2, 8)
    entries = {**split(a, range(0, 4), 8), **split(b, range(4, 8), 8)}
    joined = join(entries, range(0, 8), 8)
    assert joined["step"] == 2 and joined["consumed"] == 0
    assert joined["state"]["lanes"] == {**a["state"]["lanes"], **b["state"]["lanes"]}
    whole = _states(recipe, 1, 16)[0]  # world 1: 8 microbatches of 2 per step -> 2 steps
    assert joined["state"]["lanes"] == whole["state"]["lanes"]
    # and the joined state resumes: the next microbatch equals the uninterrupted one
    resumed = InProcessLoader(recipe, 0, 1, 2)
    resumed.load_state_dict(joined)
    reference = InProcessLoader(recipe, 0, 1, 2)
    ref = iter(reference)
    for _ in range(16):
        next(ref)
    assert next(iter(resumed)).input_ids.tobytes() == next(ref).input_ids.tobytes()


def test_a_damaged_entry_is_refused_by_name(make_recipe) -> None:
    state = _states(make_recipe(), 1, 8)[0]
    entries = split(state, range(8), 8)
    body = json.loads(entries[lane_key(3)])
    body["state"]["seqs"] += 1  # one number changed, the SHA-256 left alone
    entries[lane_key(3)] = json.dumps(body)
    with pytest.raises(MismatchError, match=r"entry .lane_00003. fails its integrity check"):
        join(entries, range(8), 8)


def test_lanes_saved_at_different_positions_are_refused(make_recipe) -> None:
    recipe = make_recipe()
    early = _states(recipe, 2, 4)[0]
    late = _states(recipe, 2, 8)[1]
    entries = {**split(early, range(0, 4), 8), **split(late, range(4, 8), 8)}
    with pytest.raises(MismatchError, match=r"lanes 0-3 at step 1 .*lanes 4-7 at step 2"):
        join(entries, range(8), 8)


def test_a_missing_lane_and_another_lane_count_are_named(make_recipe) -> None:
    state = _states(make_recipe(), 2, 4)[0]
    entries = split(state, range(0, 4), 8)
    with pytest.raises(MismatchError, match=r"no entry 'lane_00004' for lane 4"):
        join(entries, range(0, 8), 8)
    with pytest.raises(MismatchError, match=r"saved with 8 lanes; this recipe has 16"):
        join(entries, range(0, 4), 16)


@pytest.mark.parametrize(("change", "message"), [
    ({"step": -1}, r"client state\.step -1 must be >= 0"),
    ({"consumed": True}, r"client state\.consumed must be an integer, got True"),
    ({"world_size": -2}, r"client state\.world_size -2 must be >= 0"),
    ({"stepp": 3}, r"client state\.stepp is not a known key"),
    ({"state": [1]}, r"lane states must be an object or null, got list"),
])
def test_a_client_state_with_a_bad_value_is_refused_naming_it(make_recipe, change,
                                                               message) -> None:
    from datalane import ConfigError

    loader = InProcessLoader(make_recipe(), 0, 1, 2)
    state = {**loader.state_dict(), **change}
    with pytest.raises((MismatchError, ConfigError), match=message):
        loader.load_state_dict(state)


def test_a_negative_resume_step_is_refused_before_any_call() -> None:
    from datalane import ConfigError
    from datalane.client import SidecarLoader

    with pytest.raises(ConfigError, match=r"resume_step must be an integer in \[0, 10\^12\), "
                                          r"got -3"):
        SidecarLoader("/nonexistent.sock", rank=0, world_size=1, resume_step=-3)


def _saved(lanes: range, step: int = 2) -> dict:
    """A hand-made client state of a rank owning ``lanes`` of 8 at ``step`` (world 2,
    microbatch 2); lane ``i``'s state is a marker naming it (join does not read inside)."""
    return {"format": CLIENT_STATE_FORMAT, "step": step, "consumed": 0, "world_size": 2,
            "microbatch_size": 2, "fingerprint": "f" * 64,
            "state": {"step": step, "fingerprint_doc": {"recipe": {"lanes": 8}},
                      "lanes": {str(i): {"lane": i, "marker": f"state of lane {i}"}
                                for i in lanes}}}


def test_a_rank_owning_lanes_3_to_5_joins_exactly_its_lanes_from_two_saved_ranks() -> None:
    # saved by world 2 (lanes 0-3 and 4-7); read back by a rank of world 3 owning lanes 3-5,
    # which straddles both saved ranks and does not start at lane 0
    entries = {**split(_saved(range(0, 4)), range(0, 4), 8),
               **split(_saved(range(4, 8)), range(4, 8), 8)}
    joined = join(entries, range(3, 6), 8)
    lanes = {"3": {"lane": 3, "marker": "state of lane 3"},
             "4": {"lane": 4, "marker": "state of lane 4"},
             "5": {"lane": 5, "marker": "state of lane 5"}}
    assert joined["state"]["lanes"] == lanes
    assert (joined["step"], joined["consumed"], joined["world_size"],
            joined["microbatch_size"]) == (2, 0, 2, 2)
    state = {"format": CHECKPOINT_FORMAT, "step": 2, "fingerprint": "f" * 64,
             "lanes_total": 8, "lanes": lanes,
             "fingerprint_doc": {"recipe": {"lanes": 8}}}
    assert joined["state"] == {**state, "sha256": checkpoint_sha256(state)}
    # without the second saved rank, the first lane of 3-5 it held is named
    first = split(_saved(range(0, 4)), range(0, 4), 8)
    with pytest.raises(MismatchError, match="no entry 'lane_00004' for lane 4"):
        join(first, range(3, 6), 8)


@pytest.mark.parametrize(("key", "field"), [("lane", "lane"), ("lane", "step"),
                                            ("recipe", "lanes_total")])
def test_a_resealed_entry_without_a_field_is_refused_naming_it(make_recipe, key: str,
                                                               field: str) -> None:
    """A seal anyone can recompute proves the bytes whole, not that the entry is complete: an
    entry without one of its format's fields is a MismatchError naming it, not a KeyError."""
    state = _states(make_recipe(), 1, 8)[0]
    entries = split(state, range(8), 8)
    name = lane_key(3) if key == "lane" else RECIPE_KEY
    body = json.loads(entries[name])
    del body[field], body[SEAL_KEY]
    entries[name] = json.dumps(seal(body))
    with pytest.raises(MismatchError, match=rf"lacks the fields \['{field}'\]"):
        join(entries, range(8), 8)


# -- each refusal of split and of an entry's opening, on hand-made states ------------------

def test_split_refuses_what_is_no_client_state_or_disagrees_with_itself() -> None:
    from datalane import ConfigError

    with pytest.raises(MismatchError, match=r"^not a datalane client state \(format 'x'\)$"):
        split({**_saved(range(4)), "format": "x"}, range(4), 8)
    with pytest.raises(ConfigError, match=r"^the loader stands at step 2 with no lane states "
                                          r"yet"):
        split({**_saved(range(4)), "state": None}, range(4), 8)
    with pytest.raises(MismatchError, match=r"^the client state at step 3 carries lane states "
                                            r"of step 2$"):
        split({**_saved(range(4)), "step": 3}, range(4), 8)
    with pytest.raises(MismatchError, match=r"^the client state of step 2 has no state for "
                                            r"lane 4$"):
        split(_saved(range(4)), range(3, 5), 8)


def test_split_at_step_0_before_any_state_writes_entries_without_one() -> None:
    """A loader that has not opened, at step 0, saves its position and no lane state; the
    entries join back into that (state None)."""
    entries = split({**_saved(range(4), step=0), "state": None}, range(4), 8)
    assert json.loads(entries[lane_key(2)])["state"] is None
    joined = join(entries, range(4), 8)
    assert (joined["step"], joined["state"]) == (0, None)


def test_the_entries_are_canonical_json() -> None:
    """Sorted keys and no spaces: the bytes DCP stores are the same for the same entry."""
    entry = split(_saved(range(1)), range(1), 8)[lane_key(0)]
    assert entry == json.dumps(json.loads(entry), sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(("raw", "message"), [
    (7, r"entry 'lane_00001' must be a JSON string, got int"),
    ("[1]", r"entry 'lane_00001' is not a datalane entry \(format 'list', expected "
            r"'datalane\.lane-entry/v1'\)"),
    ('{"format": "datalane.recipe-entry/v1"}',
     r"entry 'lane_00001' is not a datalane entry \(format 'datalane\.recipe-entry/v1'"),
])
def test_an_entry_that_is_no_sealed_lane_entry_is_refused(raw: object, message: str) -> None:
    entries = split(_saved(range(4)), range(4), 8)
    entries[lane_key(1)] = raw
    with pytest.raises(MismatchError, match=message):
        join(entries, range(4), 8)


def test_an_entry_may_come_as_bytes_and_must_carry_its_seal() -> None:
    """DCP may hand an entry back as bytes: read as UTF-8. An entry whose seal was taken
    off is refused (every entry is sealed)."""
    entries = split(_saved(range(4)), range(4), 8)
    entries = {k: v.encode() for k, v in entries.items()}
    assert join(entries, range(4), 8)["step"] == 2
    body = json.loads(entries[lane_key(2)])
    del body[SEAL_KEY]
    entries[lane_key(2)] = json.dumps(body).encode()
    with pytest.raises(MismatchError, match=r"entry 'lane_00002'"):
        join(entries, range(4), 8)


def test_an_entry_under_another_lane_s_key_is_refused() -> None:
    entries = split(_saved(range(4)), range(4), 8)
    entries[lane_key(1)] = entries[lane_key(2)]  # lane 2's entry, sealed, under lane 1's key
    with pytest.raises(MismatchError, match=r"^entry 'lane_00001' holds lane 2$"):
        join(entries, range(4), 8)


def test_positions_that_differ_are_named_lane_range_by_lane_range() -> None:
    entries = {**split(_saved(range(0, 2)), range(0, 2), 8),
               **split(_saved(range(2, 4), step=3), range(2, 4), 8)}
    with pytest.raises(MismatchError, match=r"lanes 0-1 at step 2 \(0 microbatches in\); "
                                            r"lanes 2-3 at step 3 \(0 microbatches in\)"):
        join(entries, range(4), 8)

"""Lane states and checkpoints as JSON (:mod:`datalane.spec.state`, docs/checkpoint-format.md):
the encoded forms written out by hand, and each range rule of the readers on its own. A state
that no lane could have written is a MismatchError naming the field and the value."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.fingerprint import fingerprint_of
from datalane.spec.integrity import content_sha256
from datalane.spec.state import (
    CHECKPOINT_FORMAT,
    Checkpoint,
    Counters,
    LaneState,
    MixtureBase,
    PackerState,
    Piece,
    SourceCursor,
    check_step,
    checkpoint_text,
    merge_checkpoints,
)

FP = "f" * 64


def lane_json(**fields: Any) -> dict[str, Any]:
    """The JSON of a fresh lane 0 of one source, with ``fields`` replaced."""
    return {"v": 2, "lane": 0, "seqs": 0, "src": [[0, 0, 0, -1, 0]], "mix": [0],
            "n": [0, 0, 0, 0, {}], **fields}


def sealed(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "sha256": content_sha256(doc, ("fingerprint_doc",))}


def checkpoint_json(lanes: Any, lanes_total: int = 2, **fields: Any) -> dict[str, Any]:
    return sealed({"format": CHECKPOINT_FORMAT, "step": 3, "fingerprint": FP,
                   "lanes_total": lanes_total, "lanes": lanes, "fingerprint_doc": None,
                   **fields})


# -- steps -----------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [0, 10**12 - 1])
def test_a_step_is_an_integer_from_0_below_10_to_the_12(step: int) -> None:
    assert check_step(step) == step


@pytest.mark.parametrize("step", [-1, 10**12, True, 1.0, "3"])
def test_any_other_step_is_refused_naming_it(step: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^resume_step must be an integer in \[0, 10\^12\), "
                                          rf"got {step!r}$"):
        check_step(step, "resume_step")


# -- the pieces of a lane state ---------------------------------------------------------------

def test_a_cursor_is_five_integers_and_pos_minus_1_is_the_chunk_start() -> None:
    cursor = SourceCursor.decode([1, 2, 3, -1, 4], "c")
    assert cursor == SourceCursor(1, 2, 3, -1, 4)
    assert cursor.encode() == [1, 2, 3, -1, 4]


def test_every_count_may_reach_the_int64_maximum_and_no_further() -> None:
    top = 9223372036854775807  # 2^63 - 1
    assert SourceCursor.decode([0, 0, 0, 0, top], "c").offset == top
    assert Counters.decode([top, 0, 0, 0, {"x": top}], "n").docs == top


@pytest.mark.parametrize(("data", "message"), [
    ([0, 0, 0, -2, 0], "c pos must be at least -1, got -2"),
    ([-1, 0, 0, 0, 0], "c epoch must be at least 0, got -1"),
    ([0, 0, 0, 0, 2**63], r"c offset must be at most 2\^63 - 1, got 9223372036854775808"),
    ([0, 0, 0, 0], r"c must be a list of 5 integers \[epoch, block, chunk, pos, offset\], "
                   r"got \[0, 0, 0, 0\]"),
    ([0, 0, True, 0, 0], "c chunk must be an integer, got True"),
])
def test_a_cursor_out_of_range_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=f"^{message}$"):
        SourceCursor.decode(data, "c")


def test_a_piece_is_source_reference_start_stop() -> None:
    piece = Piece.decode([1, [2, 30], 4, 9], "p")
    assert piece == Piece(1, (2, 30), 4, 9)
    assert piece.tokens == 5
    assert piece.encode() == [1, [2, 30], 4, 9]
    assert Piece.decode([0, [1, 2, 3, 4], 0, 1], "p").ref == (1, 2, 3, 4)  # 4 integers at most


def test_a_version_1_piece_is_source_file_position_start_stop() -> None:
    assert Piece.decode_v1([1, 2, 30, 4, 9], "p") == Piece(1, (2, 30), 4, 9)


@pytest.mark.parametrize(("data", "message"), [
    ([0, [1], 3, 3], r"p \[0, \[1\], 3, 3\] is an empty token range \[3, 3\)"),
    ([0, [1], 4, 3], r"p \[0, \[1\], 4, 3\] is an empty token range \[4, 3\)"),
    ([0, [], 0, 1], "p: a document reference has 1 to 4 integers, got \\[\\]"),
    ([0, [1, 2, 3, 4, 5], 0, 1], "p: a document reference has 1 to 4 integers"),
    ([0, [1, -1], 0, 1], "p reference\\[1\\] must be at least 0, got -1"),
    ([0, (1,), 0, 1], "p must be \\[source, \\[reference...\\], start, stop\\]"),
    ([0, [1], 0], "p must be \\[source, \\[reference...\\], start, stop\\]"),
])
def test_a_bad_piece_is_refused_naming_it(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        Piece.decode(data, "p")


def test_counters_add_up_field_by_field_and_merge_skip_reasons() -> None:
    a = Counters(1, 2, 3, 4, {"x": 1})
    a.skip("x")
    a.skip("y")
    a.add(Counters(10, 20, 30, 40, {"y": 5, "z": 1}))
    assert a == Counters(11, 22, 33, 44, {"x": 2, "y": 6, "z": 1})


def test_counters_encode_their_skip_reasons_sorted() -> None:
    counters = Counters(1, 2, 3, 4, {"b": 1, "a": 2})
    assert json.dumps(counters.encode()) == '[1, 2, 3, 4, {"a": 2, "b": 1}]'
    assert Counters.decode(counters.encode(), "n") == counters


def test_a_skip_reason_counted_0_times_loads() -> None:
    assert Counters.decode([0, 0, 0, 0, {"x": 0}], "n").skipped == {"x": 0}


@pytest.mark.parametrize(("data", "message"), [
    ([0, 0, 0, 0, {"x": -1}], "n skipped 'x' must be at least 0, got -1"),
    ([0, 0, -1, 0, {}], "n tokens must be at least 0, got -1"),
    ([0, 0, 0, 0, []], r"n must be \[docs, kept, tokens, padding, \{reason: n\}\]"),
    ([0, 0, 0, {}], r"n must be \[docs, kept, tokens, padding, \{reason: n\}\]"),
])
def test_bad_counters_are_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        Counters.decode(data, "n")


def test_mixture_base_values_round_trip_and_extend_with_zeros() -> None:
    base = MixtureBase.decode([[0.5, 1], [10, 0]], "b")
    assert base == MixtureBase((0.5, 1.0), (10, 0))
    assert base.encode() == [[0.5, 1.0], [10, 0]]
    assert base.extended(3) == MixtureBase((0.5, 1.0, 0.0), (10, 0, 0))
    assert MixtureBase.initial(2) == MixtureBase((0.0, 0.0), (0, 0))


@pytest.mark.parametrize(("data", "message"), [
    ([[0.5], [1, 2]], "b has 1 passes and 2 anchors; one of each per source"),
    ([[float("inf")], [1]], r"b pass\[0\] must be a finite number, got inf"),
    ([[True], [1]], r"b pass\[0\] must be a finite number, got True"),
    ([[0.5], [-1]], r"b anchor\[0\] must be at least 0, got -1"),
    ([[0.5]], r"b must be \[\[pass...\], \[anchor...\]\], got \[\[0.5\]\]"),
    ([0.5, [1]], "b passes must be a list, got float 0.5"),
])
def test_bad_mixture_base_values_are_refused(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        MixtureBase.decode(data, "b")


# -- lane states -------------------------------------------------------------------------------

def test_a_fresh_lane_state_is_its_documented_json() -> None:
    state = LaneState.initial(3, 2)
    assert state.to_json() == {"v": 2, "lane": 3, "seqs": 0,
                               "src": [[0, 0, 0, -1, 0], [0, 0, 0, -1, 0]], "mix": [0, 0],
                               "n": [0, 0, 0, 0, {}]}
    assert state.encoded_size() == len(
        '{"v":2,"lane":3,"seqs":0,"src":[[0,0,0,-1,0],[0,0,0,-1,0]],"mix":[0,0],'
        '"n":[0,0,0,0,{}]}')


def test_a_lane_state_round_trips_with_its_packer_end_and_mixture_base() -> None:
    state = LaneState(1, 8, (SourceCursor(0, 1, 2, 3, 4),), (70,),
                      PackerState("wrap", {"held": [[0, [0, 5], 1, 2]]}), True,
                      Counters(5, 4, 70, 2, {"too_long": 1}), MixtureBase((0.25,), (7,)))
    data = state.to_json()
    assert data["pack"] == {"wrap": {"held": [[0, [0, 5], 1, 2]]}}
    assert data["end"] == 1 and data["mixb"] == [[0.25], [7]]
    assert LaneState.from_json(json.loads(json.dumps(data))) == state


def test_a_lane_that_has_not_ended_writes_no_end_key() -> None:
    assert "end" not in LaneState.initial(0, 1).to_json()
    assert LaneState.from_json(lane_json(end=0)).ended is False


def test_a_version_1_carry_over_is_read_and_written_back_as_version_1() -> None:
    """A v1 state (carry/pend as [source, file, position, start, stop]) restored and saved
    again before its packer read it keeps its own version and form."""
    data = lane_json(v=1, carry=[[[0, 1, 2, 3, 4]]], pend=[0, 5, 6, 0, 1])
    state = LaneState.from_json(data)
    assert state.packer == PackerState(None, {"carry": [[[0, [1, 2], 3, 4]]],
                                              "pending": [0, [5, 6], 0, 1]})
    assert state.to_json() == data


@pytest.mark.parametrize("fields", [
    {"carry": [[[0, 1, 2, 3, 4]]]},                # carried pieces, nothing pending
    {"carry": [], "pend": [0, 5, 6, 0, 1]},       # only a pending piece
])
def test_either_part_of_a_version_1_carry_over_keeps_version_1(fields: dict[str, Any]) -> None:
    data = lane_json(v=1, **fields)
    assert LaneState.from_json(data).to_json() == data


def test_a_version_1_state_without_carry_over_is_written_as_version_2() -> None:
    data = lane_json(v=1, carry=[])
    assert LaneState.from_json(data).to_json() == lane_json()


@pytest.mark.parametrize(("data", "message"), [
    (lane_json(v=3), "s has schema version 3; this datalane reads versions 1 to 2"),
    (lane_json(v=0), "s has schema version 0"),
    (lane_json(v=True), "s has schema version True"),
    (lane_json(extra=1), r"s has unknown keys \['extra'\]"),
    (lane_json(pack={}, carry=[]), r"s has unknown keys \['carry'\]"),
    (lane_json(v=1, carry=[], pack={}), r"s has unknown keys \['pack'\]"),
    ({k: v for k, v in lane_json().items() if k != "seqs"}, "s lacks the key 'seqs'"),
    (lane_json(end=2), "s.end must be 1 when present, got 2"),
    (lane_json(end=1.0), "s.end must be 1 when present, got 1.0"),
    (lane_json(mixb=[[0.0, 0.0], [0, 0]]), "s.mixb has 2 sources, .mix 1"),
    (lane_json(mix=[-1]), r"s.mix\[0\] must be at least 0, got -1"),
    (lane_json(lane=-1), "s.lane must be at least 0, got -1"),
    (lane_json(pack={"": {}}), "s.pack names no packer"),
    (lane_json(pack={"wrap": []}), r"s.pack.wrap must be an object, got \[\]"),
    (lane_json(pack={"a": {}, "b": {}}), "s.pack must be an object of one key"),
    ([], "s must be a JSON object, got list"),
])
def test_a_bad_lane_state_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        LaneState.from_json(data, "s")


# -- checkpoints -------------------------------------------------------------------------------

def test_a_checkpoint_round_trips_sealed() -> None:
    cp = Checkpoint(3, FP, None, {1: LaneState.initial(1, 1)}, 2)
    data = cp.to_json()
    assert list(data)[-1] == "sha256"
    assert data["sha256"] == content_sha256(data, ("fingerprint_doc",))
    back = Checkpoint.from_json(json.loads(cp.dumps()))
    assert (back.step, back.fingerprint, back.lanes, back.lanes_total) == (
        3, FP, {1: LaneState.initial(1, 1)}, 2)


def test_a_checkpoint_is_dumped_as_canonical_json() -> None:
    """Sorted keys, no whitespace (docs/checkpoint-format.md: canonical JSON everywhere)."""
    text = Checkpoint(3, FP, None, {}, 2).dumps()
    assert list(json.loads(text)) == ["fingerprint", "fingerprint_doc", "format", "lanes",
                                      "lanes_total", "sha256", "step"]
    assert text.startswith('{"fingerprint":"' + FP + '","fingerprint_doc":null,"format":')
    assert " " not in text


def test_checkpoint_text_is_the_compact_json_byte_for_byte() -> None:
    doc = {"recipe": {"seed": 1}}
    lanes = {0: LaneState.initial(0, 1), 1: LaneState.initial(1, 1)}
    cp = Checkpoint(7, fingerprint_of(doc), doc, lanes, 2)
    pairs = [(k, json.dumps(v.to_json(), separators=(",", ":"))) for k, v in lanes.items()]
    doc_json = json.dumps(doc, separators=(",", ":"))
    text = checkpoint_text(7, cp.fingerprint, 2, pairs, doc_json)
    assert text == json.dumps(cp.to_json(), separators=(",", ":"))
    # the lane states may be any iterable, one that can be read only once too
    assert checkpoint_text(7, cp.fingerprint, 2, iter(pairs), doc_json) == text


def test_an_unsealed_checkpoint_loads_only_when_allowed() -> None:
    data = checkpoint_json({})
    del data["sha256"]
    with pytest.raises(MismatchError, match="cp carries no sha256 of its content"):
        Checkpoint.from_json(data, "cp")
    assert Checkpoint.from_json(data, "cp", allow_unsealed=True).step == 3


def test_a_fingerprint_document_must_hash_to_the_fingerprint() -> None:
    doc = {"recipe": {"seed": 1}}
    good = Checkpoint.from_json(checkpoint_json({}, fingerprint=fingerprint_of(doc),
                                                fingerprint_doc=doc), "cp")
    assert good.fingerprint_doc == doc
    with pytest.raises(MismatchError, match=r"^cp: its fingerprint document does not hash to its "
                                            r"fingerprint ffffffffffffffff\.\.\.; it was "
                                            r"altered or damaged and will not be used$"):
        Checkpoint.from_json(checkpoint_json({}, fingerprint_doc=doc), "cp")


@pytest.mark.parametrize(("data", "message"), [
    (checkpoint_json({}, step=10**12), "cp: step must be at most 999999999999, got 10"),
    (checkpoint_json({}, step=-1), "cp: step must be at least 0, got -1"),
    (checkpoint_json({}, lanes_total=0), "cp: lanes_total must be at least 1, got 0"),
    (checkpoint_json({}, fingerprint=""), "cp: fingerprint must be a non-empty string, got ''"),
    (checkpoint_json({}, fingerprint_doc=[]), "cp: fingerprint_doc must be an object or null, "
                                              "got list"),
    (checkpoint_json([]), r"cp: lanes must be an object of lane number -> lane state, got "
                          r"list \[\]"),
    (checkpoint_json({"2": lane_json(lane=2)}), r"cp holds lane 2, outside 0..1 of its 2 lanes"),
    (checkpoint_json({"01": lane_json(lane=1)}), r"cp has the lane key '01', which is not a "
                                                 r"lane number"),
    (checkpoint_json({"-1": lane_json()}), r"cp has the lane key '-1'"),
    (checkpoint_json({"x": lane_json()}), r"cp has the lane key 'x'"),
    # superscript two: a digit to str.isdigit, but not to int()
    (checkpoint_json({"\u00b2": lane_json()}), r"cp has the lane key '\u00b2'"),
    (checkpoint_json({"1": lane_json()}), "cp: lane 1 holds the state of lane 0"),
    (checkpoint_json({}, extra=1), r"cp has unknown keys \['extra'\]"),
    ({"format": "other"}, r"cp is not a datalane checkpoint \(format 'other', expected "
                          r"'datalane.checkpoint/v1'\)"),
    ([], r"cp is not a datalane checkpoint \(format 'list'"),
    ({k: v for k, v in checkpoint_json({}).items() if k != "lanes"}, "cp lacks the key 'lanes'"),
])
def test_a_bad_checkpoint_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(MismatchError, match=message):
        Checkpoint.from_json(data, "cp")


def test_a_checkpoint_altered_after_sealing_is_refused_naming_its_seal() -> None:
    data = checkpoint_json({})
    claimed = data["sha256"]
    data["step"] = 4  # one digit changed, the seal kept
    with pytest.raises(MismatchError, match=rf"^cp fails its integrity check: it carries sha256 "
                                            rf"{claimed[:16]}\.\.\., but its content hashes to "):
        Checkpoint.from_json(data, "cp")


def test_the_last_step_and_a_single_lane_are_in_range() -> None:
    cp = Checkpoint.from_json(checkpoint_json({"0": lane_json()}, lanes_total=1,
                                              step=10**12 - 1), "cp")
    assert (cp.step, cp.lanes_total, cp.lanes) == (999999999999, 1, {0: LaneState.initial(0, 1)})


def test_a_state_file_loads_verified_and_names_its_path_when_damaged(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(Checkpoint(3, FP, None, {1: LaneState.initial(1, 1)}, 2).dumps())
    named = re.escape(f"state file {path}")
    cp = Checkpoint.load(str(path))
    assert (cp.step, cp.fingerprint, cp.lanes, cp.lanes_total) == (
        3, FP, {1: LaneState.initial(1, 1)}, 2)
    path.write_text(path.read_text().replace('"step":3', '"step":4'))
    with pytest.raises(MismatchError, match=f"^{named} fails its integrity check"):
        Checkpoint.load(str(path))
    unsealed = checkpoint_json({})
    del unsealed["sha256"]
    path.write_text(json.dumps(unsealed))
    with pytest.raises(MismatchError, match=f"^{named} carries no sha256"):
        Checkpoint.load(str(path))
    assert Checkpoint.load(str(path), allow_unsealed=True).step == 3


def test_a_lane_key_must_be_the_lane_s_decimal_number() -> None:
    """Lane keys are "0", "1", ...: the highest lane of the checkpoint is accepted."""
    cp = Checkpoint.from_json(checkpoint_json({"0": lane_json(), "1": lane_json(lane=1)}), "cp")
    assert sorted(cp.lanes) == [0, 1]


def test_per_rank_checkpoints_merge_into_one() -> None:
    a = Checkpoint(3, FP, None, {0: LaneState.initial(0, 1)}, 2)
    b = Checkpoint(3, FP, None, {1: LaneState.initial(1, 1)}, 2)
    merged = merge_checkpoints([a, b])
    assert sorted(merged.lanes) == [0, 1] and merged.step == 3
    assert merge_checkpoints(iter([a, b])) == merged  # any iterable, one read once too


@pytest.mark.parametrize("other", [
    Checkpoint(4, FP, None, {}, 2), Checkpoint(3, "e" * 64, None, {}, 2),
    Checkpoint(3, FP, None, {}, 3)])
def test_checkpoints_of_another_step_or_recipe_do_not_merge(other: Checkpoint) -> None:
    with pytest.raises(MismatchError, match=r"cannot merge a checkpoint of step "):
        merge_checkpoints([Checkpoint(3, FP, None, {}, 2), other])


def test_a_refused_merge_names_both_steps_fingerprints_and_lane_counts() -> None:
    with pytest.raises(MismatchError, match=r"^cannot merge a checkpoint of step 4 \(fingerprint "
                                            r"eeeeeeeeeeee, 3 lanes\) with one of step 3 "
                                            r"\(fingerprint ffffffffffff, 2 lanes\)$"):
        merge_checkpoints([Checkpoint(3, FP, None, {}, 2), Checkpoint(4, "e" * 64, None, {}, 3)])


def test_one_checkpoint_merges_into_itself() -> None:
    doc = {"recipe": {"seed": 1}}
    merged = merge_checkpoints([Checkpoint(3, fingerprint_of(doc), doc,
                                           {0: LaneState.initial(0, 1)}, 2)])
    assert merged == Checkpoint(3, fingerprint_of(doc), doc, {0: LaneState.initial(0, 1)}, 2)


def test_nothing_to_merge_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no checkpoint to merge"):
        merge_checkpoints([])
    with pytest.raises(ConfigError, match="no checkpoint to merge"):
        merge_checkpoints(iter([]))


def test_a_long_bad_value_is_shown_cut_to_60_characters() -> None:
    value = list(range(40))
    with pytest.raises(MismatchError) as e:
        Piece.decode(value, "p")
    shown = str(e.value).split("got ", 1)[1]
    assert shown == repr(value)[:57] + "..." and len(shown) == 60


def test_a_bad_value_of_60_characters_is_shown_whole() -> None:
    with pytest.raises(MismatchError, match=f"got '{'x' * 58}'$"):
        Piece.decode("x" * 58, "p")  # its repr: 60 characters
    with pytest.raises(MismatchError, match=f"got '{'x' * 56}\\.\\.\\.$"):
        Piece.decode("x" * 59, "p")  # 61: cut to 57 and "..."


@pytest.mark.parametrize("value", [
    SourceCursor(0, 0, 0, -1, 0), Piece(0, (1,), 0, 1), PackerState.empty(),
    MixtureBase.initial(1), LaneState.initial(0, 1)])
def test_the_parts_of_a_saved_state_cannot_be_changed_in_place(value: Any) -> None:
    """A restored state is shared (by the lanes resumed from it and the checkpoint kept for
    the next save): a lane that changed it in place would change what is saved."""
    field_name = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field_name, 1)

"""A manifest that is not what a writer writes is refused, naming what is wrong.

``Manifest.decode`` is what every reader of a committed step runs first (restore, audit, the
previous link of the next commit): each structural check is tried here on a manifest derived
from hand-made pod objects and then edited one field at a time, and ``build_manifest``'s
refusals of objects that cannot form a step are tried with objects a writer could never agree
on. Pure functions: no store, no files.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from datalane.spec.errors import MismatchError, StorageError
from datalane.spec.state import LaneState
from datalane.store.amendments import PhaseStart
from datalane.store.manifest import Manifest, PodRead, build_manifest, missing_lanes
from datalane.store.podstate import PodObject, sha256_hex
from tests.store.support import FINGERPRINT, FP_DOC, digest, global_of, lane_state

LANES = 4
STEP = 6
URI = "mem://m"
SHA_A = "a" * 64
SHA_B = "b" * 64


def read(name: str, states: dict[int, LaneState], step: int = STEP, *,
         digests: dict[int, dict[int, bytes]] | None = None, fingerprint: str = FINGERPRINT,
         fp_doc: dict[str, Any] | None = None, lanes: int = LANES,
         file: str | None = None) -> PodRead:
    """Pod ``name``'s object of ``step`` holding ``states``, as read back from ``file``."""
    obj = PodObject.build(step, name, states, digests or {}, fingerprint,
                          FP_DOC if fp_doc is None else fp_doc, lanes)
    data = obj.encode()
    file = file or f"pod-{name}.json"
    return PodRead(file, f"mem://run/{file}", data, PodObject.decode(data, file))


def whole(step: int = STEP) -> list[PodRead]:
    """Two pods holding lanes 0-1 and 2-3 of ``step``."""
    return [read("a", {k: lane_state(k, step) for k in (0, 1)}, step),
            read("b", {k: lane_state(k, step) for k in (2, 3)}, step)]


def edited(**fields: Any) -> bytes:
    """A committed manifest of step 6 (previous step 3, seq 1) with ``fields`` replaced."""
    manifest = build_manifest(STEP, whole(), (3, SHA_A), 1)
    assert manifest is not None
    doc = json.loads(manifest.encode())
    doc.update(fields)
    return json.dumps(doc).encode()


def refused(data: bytes) -> str:
    with pytest.raises(StorageError) as err:
        Manifest.decode(data, URI)
    assert not err.value.transient
    return str(err.value)


def test_a_manifest_round_trips_with_every_field() -> None:
    doc = {"recipe": {"phases": [{"name": "warmup", "start_step": 0},
                                 {"name": "anneal", "start_step": 4}]}}
    pods = [read("a", {k: lane_state(k, STEP) for k in range(LANES)}, fp_doc=doc)]
    manifest = build_manifest(STEP, pods, (3, SHA_A), 7)
    assert manifest is not None
    assert manifest.phases == (PhaseStart("warmup", 0), PhaseStart("anneal", 4))
    assert (manifest.previous_step, manifest.previous_sha256, manifest.seq) == (3, SHA_A, 7)
    assert manifest.objects == {"pod-a.json": sha256_hex(pods[0].data)}
    assert Manifest.decode(manifest.encode(), URI) == manifest
    raw = json.loads(manifest.encode())
    assert raw["phases"] == [{"name": "warmup", "start_step": 0},
                             {"name": "anneal", "start_step": 4}]
    assert raw["seq"] == 7 and raw["previous"] == {"step": 3, "sha256": SHA_A}
    # the first manifest of a datalane before phases and seq: neither key, both read back empty
    first = build_manifest(STEP, whole(), None)
    assert first is not None
    assert "phases" not in json.loads(first.encode()) and "seq" not in json.loads(first.encode())
    again = Manifest.decode(first.encode(), URI)
    assert (again.phases, again.seq, again.previous_step, again.previous_sha256) == (
        (), None, None, None)
    assert again.objects_for([3, 2, 0]) == ["pod-a.json", "pod-b.json"]
    assert again.objects_for([3]) == ["pod-b.json"]


def test_a_fingerprint_doc_that_is_not_an_object_is_refused() -> None:
    assert refused(edited(fingerprint_doc=["seed", 5])) == (
        "corrupt manifest mem://m: fingerprint_doc must be an object or null")
    assert Manifest.decode(edited(fingerprint_doc=None), URI).fingerprint_doc is None


def test_a_lane_map_that_is_not_every_lane_once_is_refused() -> None:
    doc = json.loads(edited())
    del doc["lanes"]["3"]
    assert refused(json.dumps(doc).encode()) == (
        "corrupt manifest mem://m: lists lanes [0, 1, 2]..., not exactly 0..3")
    assert refused(edited(lanes_total=5)) == (
        "corrupt manifest mem://m: lists lanes [0, 1, 2, 3]..., not exactly 0..4")
    wide = build_manifest(STEP, [read("a", {k: lane_state(k, STEP) for k in range(10)},
                                      lanes=10)], None)
    assert wide is not None
    doc = json.loads(wide.encode())
    doc["lanes_total"] = 11  # the first eight lanes are named
    assert refused(json.dumps(doc).encode()) == (
        "corrupt manifest mem://m: lists lanes [0, 1, 2, 3, 4, 5, 6, 7]..., not exactly 0..10")


def test_a_lane_in_an_object_the_manifest_does_not_list_is_refused() -> None:
    doc = json.loads(edited())
    doc["lanes"]["2"]["object"] = "pod-c.json"
    assert refused(json.dumps(doc).encode()) == (
        "corrupt manifest mem://m: lane 2 is in pod-c.json, which the manifest does not list "
        "among its objects")


def test_an_object_that_is_not_a_pod_object_is_refused() -> None:
    doc = json.loads(edited())
    doc["objects"]["MANIFEST.json"] = SHA_B
    assert refused(json.dumps(doc).encode()) == (
        "corrupt manifest mem://m: object names ['MANIFEST.json', 'pod-a.json', 'pod-b.json'] "
        "are not all pod objects")


def test_a_half_set_previous_link_is_refused() -> None:
    why = ("corrupt manifest mem://m: previous.step and previous.sha256 must both be set or "
           "both be null")
    assert refused(edited(previous={"step": 3, "sha256": None})) == why
    assert refused(edited(previous={"step": None, "sha256": SHA_A})) == why
    first = Manifest.decode(edited(previous={"step": None, "sha256": None}), URI)
    assert (first.previous_step, first.previous_sha256) == (None, None)


def test_an_empty_phase_list_and_a_negative_seq_are_refused() -> None:
    assert refused(edited(phases=[])) == (
        "corrupt manifest mem://m: phases must list at least one phase when present")
    assert refused(edited(seq=-1)) == "corrupt manifest mem://m: seq must be at least 0, got -1"
    assert Manifest.decode(edited(seq=0), URI).seq == 0
    assert Manifest.decode(edited(phases=[{"name": "all", "start_step": 0}]), URI).phases == (
        PhaseStart("all", 0),)


@pytest.mark.parametrize(("fields", "why"), [
    ({"step": "6"}, "TypeError(\"expected an integer, got '6'\")"),
    ({"step": True}, "TypeError('expected an integer, got True')"),
    ({"lanes_total": 4.0}, "TypeError('expected an integer, got 4.0')"),
    ({"fingerprint": 5}, "TypeError('expected a string, got 5')"),
    ({"ledger": [[5, "A" * 64]]},
     "ValueError(\"expected a 64-character lowercase hex SHA-256, got '" + "A" * 64 + "'\")"),
    ({"previous": {"step": 3, "sha256": 7}},
     "ValueError('expected a 64-character lowercase hex SHA-256, got 7')"),
    ({"objects": {"pod-a.json": "ab"}},
     "ValueError(\"expected a 64-character lowercase hex SHA-256, got 'ab'\")"),
    ({"seq": "1"}, "TypeError(\"expected an integer, got '1'\")"),
    ({"phases": [{"name": 3, "start_step": 0}]}, "TypeError('expected a string, got 3')"),
    ({"previous": {"step": 3}}, "KeyError('sha256')"),
])
def test_a_malformed_field_is_refused_naming_the_value(fields: dict[str, Any],
                                                        why: str) -> None:
    assert refused(edited(**fields)) == f"corrupt manifest mem://m: malformed field: {why}"


# ---------------------------------------------------------------- objects that cannot commit


def test_an_object_of_another_step_is_refused() -> None:
    stale = read("b", {k: lane_state(k, 5) for k in (2, 3)}, 5)
    with pytest.raises(MismatchError) as err:
        build_manifest(STEP, [whole()[0], stale], None)
    assert str(err.value) == "mem://run/pod-b.json holds the state of step 5, not 6"


def test_an_object_under_another_pod_name_is_refused() -> None:
    moved = read("b", {k: lane_state(k, STEP) for k in (2, 3)}, file="pod-c.json")
    with pytest.raises(MismatchError) as err:
        build_manifest(STEP, [whole()[0], moved], None)
    assert str(err.value) == "mem://run/pod-c.json claims to be the object of pod 'b'"


def test_objects_of_two_recipes_are_refused_without_a_hint_when_the_prefix_differs() -> None:
    other = read("b", {k: lane_state(k, STEP) for k in (2, 3)}, fingerprint="e" * 64)
    with pytest.raises(MismatchError) as err:
        build_manifest(STEP, [whole()[0], other], None)
    assert str(err.value) == (
        "step 6 mixes recipes: mem://run/pod-a.json has fingerprint ffffffffffffffff..., "
        "mem://run/pod-b.json has eeeeeeeeeeeeeeee...")


def test_objects_of_two_lane_counts_are_refused() -> None:
    other = read("b", {k: lane_state(k, STEP) for k in (2, 3)}, lanes=5)
    with pytest.raises(MismatchError) as err:
        build_manifest(STEP, [whole()[0], other], None)
    assert str(err.value) == (
        "step 6 mixes lane counts: mem://run/pod-a.json has 4 lanes, mem://run/pod-b.json has 5")


def test_two_window_digests_of_one_lane_are_refused() -> None:
    a = read("a", {0: lane_state(0, STEP), 1: lane_state(1, STEP)},
             digests={4: {1: digest(4, 1)}})
    b = read("b", {2: lane_state(2, STEP), 3: lane_state(3, STEP)},
             digests={4: {1: digest(4, 2)}})
    with pytest.raises(MismatchError) as err:
        build_manifest(STEP, [a, b], None)
    assert str(err.value) == (
        f"step 4 lane 1 has two window digests: {digest(4, 1).hex()[:16]}... in "
        f"mem://run/pod-a.json and {digest(4, 2).hex()[:16]}... in mem://run/pod-b.json")


# ------------------------------------------------------------------- what a manifest holds


def test_the_ledger_holds_the_complete_steps_from_the_previous_checkpoint_on() -> None:
    rows = {s: {k: digest(s, k) for k in range(LANES)} for s in range(STEP)}
    rows[4] = {k: digest(4, k) for k in (0, 1, 2)}  # lane 3's digest of step 4 never came
    a = read("a", {k: lane_state(k, STEP) for k in (0, 1)},
             digests={s: {k: d for k, d in row.items() if k < 2} for s, row in rows.items()})
    b = read("b", {k: lane_state(k, STEP) for k in (2, 3)},
             digests={s: {k: d for k, d in row.items() if k >= 2} for s, row in rows.items()})
    since_3 = build_manifest(STEP, [a, b], (3, SHA_A), 1)
    assert since_3 is not None
    assert since_3.ledger == ((3, global_of(3, LANES)), (5, global_of(5, LANES)))
    first = build_manifest(STEP, [a, b], None, 0)
    assert first is not None
    assert [s for s, _ in first.ledger] == [0, 1, 2, 3, 5]
    assert first.ledger[0] == (0, global_of(0, LANES))


def test_missing_lanes_are_those_no_object_holds() -> None:
    a, b = whole()
    assert missing_lanes([a]) == [2, 3]
    assert missing_lanes([b]) == [0, 1]
    assert missing_lanes([a, b]) == []
    assert missing_lanes([]) == []
    assert build_manifest(STEP, [a], None) is None
    assert build_manifest(STEP, [], None) is None

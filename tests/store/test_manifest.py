"""The manifest of a step from its pod objects, as pure functions (no store, no files).

:func:`datalane.store.manifest.build_manifest` is what ``CheckpointStore.commit`` writes: a
lane's state at a step never depends on the pod that wrote it, so two objects holding the
same state of a lane commit (a stale object of an earlier topology is harmless) and two
objects holding different states of one lane are refused, naming the lane, the step and
both objects.
"""

from __future__ import annotations

import pytest

from datalane.spec.errors import MismatchError
from datalane.spec.state import LaneState
from datalane.store.manifest import PodRead, build_manifest
from datalane.store.podstate import PodObject, lane_sha256
from tests.store.support import FINGERPRINT, FP_DOC, lane_state

LANES = 4
STEP = 6


def pod(name: str, states: dict[int, LaneState]) -> PodRead:
    """The pod object ``pod-<name>.json`` of step 6 holding ``states``, as read back."""
    obj = PodObject.build(STEP, name, states, {}, FINGERPRINT, FP_DOC, LANES)
    return PodRead(f"pod-{name}.json", f"mem://run/steps/6/pod-{name}.json",
                   name.encode(), obj)


def test_two_objects_with_the_same_state_of_a_lane_commit_from_the_first_by_name() -> None:
    a = pod("a", {0: lane_state(0, STEP), 1: lane_state(1, STEP)})
    b = pod("b", {1: lane_state(1, STEP), 2: lane_state(2, STEP), 3: lane_state(3, STEP)})
    manifest = build_manifest(STEP, [b, a], None)
    assert manifest is not None
    assert {lane: e.object for lane, e in manifest.lanes.items()} == {
        0: "pod-a.json", 1: "pod-a.json", 2: "pod-b.json", 3: "pod-b.json"}
    assert manifest.lanes[1].sha256 == lane_sha256(lane_state(1, STEP).to_json())


def test_a_commit_given_two_different_states_of_one_lane_is_refused() -> None:
    a = pod("a", {0: lane_state(0, STEP), 1: lane_state(1, STEP)})
    # lane 1 as it stood two steps later: another state of the same lane at step 6
    b = pod("b", {1: lane_state(1, STEP + 2), 2: lane_state(2, STEP), 3: lane_state(3, STEP)})
    with pytest.raises(MismatchError) as err:
        build_manifest(STEP, [a, b], None)
    assert str(err.value).startswith(
        "lane 1 of step 6 has two different states, in mem://run/steps/6/pod-a.json and "
        "mem://run/steps/6/pod-b.json")
    # also before every lane is written (the step could never commit)
    with pytest.raises(MismatchError, match="lane 1 of step 6 has two different states"):
        build_manifest(STEP, [a, pod("c", {1: lane_state(1, STEP + 2)})], None)


def test_a_manifest_lane_key_is_spelled_as_the_writer_spells_it() -> None:
    """The manifest decodes its lanes as a pod object does (``podstate.number_key``): lane 1
    listed as ``"01"`` is refused as corrupt, not read as lane 1."""
    import json

    from datalane.spec.errors import StorageError
    from datalane.store.manifest import Manifest

    a = pod("a", {k: lane_state(k, STEP) for k in range(LANES)})
    manifest = build_manifest(STEP, [a], None)
    assert manifest is not None
    doc = json.loads(manifest.encode())
    assert Manifest.decode(manifest.encode(), "mem://m").lanes == manifest.lanes
    doc["lanes"]["01"] = doc["lanes"].pop("1")
    with pytest.raises(StorageError, match=r"^corrupt manifest mem://m: malformed field: "
                                           r"ValueError\(\"key '01' is not a decimal number"):
        Manifest.decode(json.dumps(doc).encode(), "mem://m")

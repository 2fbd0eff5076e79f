"""What ``PodObject.decode`` accepts of a pod object's bytes (datalane/store/podstate.py): the
object ``build`` writes, back whole; anything a writer could not have written (a step or a
lane count out of range, no lane, a number key spelled two ways, a lane or digest out of
range) is a non-transient StorageError naming the object, never a partial state."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from datalane.spec.errors import ConfigError, MismatchError, StorageError
from datalane.spec.state import LaneState
from datalane.store.podstate import PodObject, lane_sha256

URI = "mem://ckpt/step-30/pod-0.json"
DIGEST = "ab" * 32


def _written() -> PodObject:
    """Pod 0 at step 30, lanes 1 and 3 of 4, digests of steps 28 and 29."""
    return PodObject.build(30, "0", {1: LaneState.initial(1, 2), 3: LaneState.initial(3, 2)},
                           {28: {1: DIGEST, 3: DIGEST}, 29: {1: bytes(32)}}, "f" * 64,
                           {"recipe": 1}, 4)


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_written().encode())
    return doc


def test_the_written_object_decodes_to_itself() -> None:
    back = PodObject.decode(_written().encode(), URI)
    assert back == _written()
    assert sorted(back.lanes) == [1, 3] and back.digests == {
        28: {1: DIGEST, 3: DIGEST}, 29: {1: "00" * 32}}


def _refused(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(StorageError, match=rf"^corrupt pod object {URI}: {message}") as e:
        PodObject.decode(json.dumps(doc).encode(), URI)
    assert e.value.transient is False


@pytest.mark.parametrize(("field", "value", "message"), [
    ("step", -1, r"step -1 is not a step \(0 or more\)"),
    ("lanes_total", 0, r"lanes_total 0 is not a lane count \(1 or more\)"),
    ("lanes_total", -4, r"lanes_total -4 is not a lane count"),
    ("lanes", {}, r"it holds no lane state"),
    ("step", "30", r"malformed field: expected an integer, got '30'"),
    ("lanes_total", True, r"malformed field: expected an integer, got True"),
])
def test_a_field_out_of_its_range_is_refused(field: str, value: Any, message: str) -> None:
    doc = _doc()
    doc[field] = value
    _refused(doc, message)


@pytest.mark.parametrize(("path", "key"), [
    (("lanes",), "01"), (("lanes",), " 1"), (("lanes",), "+1"), (("digests",), "028"),
    (("digests", "28"), "01"), (("lanes",), "1.0"), (("digests",), "2_8"),
    (("digests",), "-28"), (("lanes",), "\u0661"),  # (an Arabic-Indic one: decimal, not ASCII)
])
def test_a_number_key_is_spelled_as_the_writer_spells_it(path: tuple[str, ...],
                                                        key: str) -> None:
    """Keys are decimal integers without sign, padding or spaces: ``"01"`` next to ``"1"``
    would otherwise be two entries for one lane, the last one read silently winning."""
    doc = _doc()
    table = doc
    for name in path:
        table = table[name]
    first = sorted(table)[0]
    table[key] = table.pop(first)
    _refused(doc, rf"(key {key!r} .*is not a decimal number|malformed field)")


def test_a_lane_outside_the_lane_count_is_refused() -> None:
    doc = _doc()
    doc["lanes_total"] = 3  # lane 3 is outside 0..2
    _refused(doc, r"entry 3 holds the state of lane 3 \(3 lanes in total\)")


@pytest.mark.parametrize(("step", "lane", "digest"), [
    ("30", "1", DIGEST),   # the checkpoint's own step: not served before it
    ("29", "4", DIGEST),   # lane 4 of 4
    ("29", "1", "AB" * 32),  # upper case: not the writer's hex
    ("29", "1", "ab" * 31),
])
def test_a_digest_entry_out_of_range_is_refused(step: str, lane: str, digest: str) -> None:
    doc = _doc()
    doc["digests"] = {step: {lane: digest}}
    _refused(doc, rf"bad digest entry step {int(step)} lane {int(lane)}")


def test_another_format_is_a_mismatch_not_corruption() -> None:
    doc = _doc()
    doc["format"] = "datalane.pod-state/v2"
    with pytest.raises(MismatchError, match=r"has format 'datalane\.pod-state/v2'"):
        PodObject.decode(json.dumps(doc).encode(), URI)


def test_the_smallest_object_decodes() -> None:
    """Step 0 (a checkpoint before any step), lane 0 of 1, no digest; and at step 1 the
    digest of step 0, lane 0: every lower bound is inclusive."""
    first = PodObject.build(0, "0", {0: LaneState.initial(0, 1)}, {}, "f" * 64, None, 1)
    assert PodObject.decode(first.encode(), URI) == first
    second = PodObject.build(1, "0", {0: LaneState.initial(0, 1)}, {0: {0: DIGEST}}, "f" * 64,
                             None, 1)
    assert PodObject.decode(second.encode(), URI).digests == {0: {0: DIGEST}}


@pytest.mark.parametrize(("field", "value", "message"), [
    ("fingerprint", 7, r"fingerprint and pod must be strings"),
    ("pod", 0, r"fingerprint and pod must be strings"),
    ("fingerprint_doc", [1], r"fingerprint_doc must be an object or null"),
    ("fingerprint_doc", "x", r"fingerprint_doc must be an object or null"),
])
def test_a_field_of_the_wrong_type_is_refused(field: str, value: Any, message: str) -> None:
    doc = _doc()
    doc[field] = value
    _refused(doc, message)


def test_a_lane_entry_that_is_no_object_is_refused() -> None:
    doc = _doc()
    doc["lanes"]["3"] = [3]
    _refused(doc, r"lane 3 is not a JSON object")


# -- what a writer may build (ConfigError naming the bad argument) ------------------------

def _build(**change: Any) -> PodObject:
    args: dict[str, Any] = {"step": 30, "pod": "0", "lanes": {1: LaneState.initial(1, 2)},
                            "digests": {29: {1: DIGEST}}, "fingerprint": "f" * 64,
                            "fingerprint_doc": None, "lanes_total": 4}
    args.update(change)
    return PodObject.build(**args)


@pytest.mark.parametrize(("change", "message"), [
    ({"lanes_total": 0}, r"^lanes_total must be a positive integer, got 0$"),
    ({"lanes_total": True}, r"^lanes_total must be a positive integer, got True$"),
    ({"lanes_total": 2.0}, r"^lanes_total must be a positive integer, got 2.0$"),
    ({"fingerprint": ""}, r"^fingerprint must be a non-empty string, got ''$"),
    ({"fingerprint": 5}, r"^fingerprint must be a non-empty string, got 5$"),
    ({"fingerprint_doc": [1]}, r"^fingerprint_doc must be a dict or None, got list$"),
    ({"lanes": {}}, r"^pod 0 has no lane state to write for step 30$"),
    ({"lanes": {2: LaneState.initial(1, 2)}}, r"^lanes\[2\] of pod 0 holds the state of lane 1$"),
    ({"lanes": {1: {"lane": 1}}}, r"^lanes\[1\] of pod 0 holds the state of lane dict$"),
    ({"lanes": {4: LaneState.initial(4, 2)}}, r"^lane 4 of pod 0 is outside 0\.\.3$"),
    ({"digests": {30: {1: DIGEST}}},
     r"^pod 0 gives digests for step 30; a checkpoint of step 30 can only carry steps 0\.\.29$"),
    ({"digests": {-1: {1: DIGEST}}}, r"^pod 0 gives digests for step -1;"),
    ({"digests": {True: {1: DIGEST}}}, r"^pod 0 gives digests for step True;"),
    ({"digests": {"29": {1: DIGEST}}}, r"^pod 0 gives digests for step '29';"),
    ({"digests": {29: {4: DIGEST}}}, r"^digest of step 29 names lane 4, outside 0\.\.3$"),
    ({"digests": {29: {1: bytes(31)}}},
     r"^digest of step 29 lane 1 must be a 32-byte SHA-256 digest, got 31 bytes$"),
    ({"digests": {29: {1: "ab" * 31}}},
     r"^digest of step 29 lane 1 must be a 32-byte digest or 64 hex characters, got 'abab"),
    ({"digests": {29: {1: 7}}}, r"^digest of step 29 lane 1 must be a 32-byte digest or 64 hex "
                                r"characters, got 7$"),
])
def test_a_writer_s_bad_argument_is_refused_by_name(change: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _build(**change)


def test_the_edges_a_writer_may_use() -> None:
    """Lane 0 and lane lanes_total - 1, the digest of step 0 and of step - 1, a digest as
    bytes or as upper-case hex (written lower-case)."""
    pod = _build(lanes={0: LaneState.initial(0, 2), 3: LaneState.initial(3, 2)},
                 digests={0: {0: bytes(range(32))}, 29: {3: "AB" * 32}}, lanes_total=4)
    assert pod.digests == {0: {0: bytes(range(32)).hex()}, 29: {3: "ab" * 32}}


# -- what a reader refuses before it looks at the fields ----------------------------------

@pytest.mark.parametrize(("data", "message"), [
    (b'{"format": "datalane.pod-st', r"not valid JSON \(27 bytes; truncated\?\)"),
    (b"\xff\xfe", r"not valid JSON \(2 bytes; truncated\?\)"),
    (b"[1, 2]", r"expected a JSON object, got list"),
])
def test_bytes_that_are_no_json_object_are_corrupt(data: bytes, message: str) -> None:
    with pytest.raises(StorageError, match=rf"^corrupt pod object {URI}: {message}"):
        PodObject.decode(data, URI)


@pytest.mark.parametrize(("drop", "add", "message"), [
    ("digests", None, r"unknown keys \[\], missing keys \['digests'\]"),
    (None, "extra", r"unknown keys \['extra'\], missing keys \[\]"),
])
def test_an_object_with_other_keys_is_corrupt(drop: str | None, add: str | None,
                                              message: str) -> None:
    doc = _doc()
    if drop:
        del doc[drop]
    if add:
        doc[add] = 1
    _refused(doc, message)


def test_the_bytes_are_canonical_json_and_the_lane_hash_is_over_them() -> None:
    """Sorted keys, no spaces, a newline; lane_sha256 is the SHA-256 of a lane's canonical
    JSON."""
    data = _written().encode()
    assert data.endswith(b"}\n") and b" " not in data
    assert data[:-1] == json.dumps(json.loads(data), sort_keys=True,
                                   separators=(",", ":")).encode()
    lane = {"b": 1, "a": [1, 2]}
    assert lane_sha256(lane) == hashlib.sha256(b'{"a":[1,2],"b":1}').hexdigest()


def test_a_pod_object_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _written().step = 31  # type: ignore[misc]

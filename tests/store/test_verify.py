"""A committed step is used only if it verifies, and every refusal names what is wrong.

``CheckpointStore`` verifies a manifest against the objects it lists before a restore, an
audit or a garbage collection relies on it. Each check is tried here on a store of two
committed steps (8 lanes in two pod objects: lanes 0-3 in ``pod-0.json``, 4-7 in
``pod-1.json``) with one thing edited, and the exact error compared. Local files only.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from datalane.spec.errors import ConfigError, StorageError
from datalane.store import CheckpointStore
from datalane.store.podstate import PodObject, canonical_json, sha256_hex

from .conftest import Backend
from .support import FP_DOC, commit_steps, lane_state, write_step


def _uri(store: CheckpointStore, step: int, name: str) -> str:
    return f"{store.uri}/steps/{step:012d}/{name}"


def _edit_manifest(local: Backend, step: int, **fields: Any) -> dict[str, Any]:
    doc = json.loads(local.read(step, "MANIFEST.json"))
    doc.update(fields)
    local.write(step, "MANIFEST.json", canonical_json(doc) + b"\n")
    return doc


def _refusal(store: CheckpointStore, step: int) -> str:
    """The error a restore of ``step`` gives; manifest() and the audit give the same."""
    with pytest.raises(StorageError) as err:
        store.load(step)
    assert not err.value.transient
    with pytest.raises(StorageError) as again:
        store.manifest(step)
    assert str(again.value) == str(err.value)
    assert step not in store.committed_steps(verify=True)
    entry = {e.step: e for e in store.audit().entries}[step]
    assert entry.problems[0] == str(err.value)
    return str(err.value)


@pytest.fixture
def store(local: Backend) -> CheckpointStore:
    store = local.store()
    commit_steps(store, [10, 20])
    return store


def test_a_manifest_of_another_step_is_refused(local: Backend, store: CheckpointStore) -> None:
    local.write(20, "MANIFEST.json", local.read(10, "MANIFEST.json"))
    assert _refusal(store, 20) == (
        f"corrupt manifest {_uri(store, 20, 'MANIFEST.json')}: it names step 10 and previous "
        f"step None")


def test_a_manifest_linking_to_its_own_step_or_later_is_refused(local: Backend,
                                                                 store: CheckpointStore) -> None:
    sha = sha256_hex(local.read(10, "MANIFEST.json"))
    for previous in (20, 21):
        _edit_manifest(local, 20, previous={"step": previous, "sha256": sha})
        assert _refusal(store, 20) == (
            f"corrupt manifest {_uri(store, 20, 'MANIFEST.json')}: it names step 20 and "
            f"previous step {previous}")


def test_a_lane_listed_in_an_object_that_does_not_hold_it_is_refused(
        local: Backend, store: CheckpointStore) -> None:
    doc = json.loads(local.read(20, "MANIFEST.json"))
    doc["lanes"]["4"]["object"] = "pod-0.json"
    _edit_manifest(local, 20, lanes=doc["lanes"])
    assert _refusal(store, 20) == (
        f"{_uri(store, 20, 'pod-0.json')} does not hold lane 4, although "
        f"{_uri(store, 20, 'MANIFEST.json')} lists it there; the checkpoint will not be used")


def test_an_object_of_another_recipe_is_refused_even_when_listed_by_its_hash(
        local: Backend, store: CheckpointStore) -> None:
    other = PodObject.build(20, "1", {k: lane_state(k, 20) for k in range(4, 8)}, {},
                            "e" * 64, FP_DOC, 8).encode()
    local.write(20, "pod-1.json", other)
    doc = json.loads(local.read(20, "MANIFEST.json"))
    _edit_manifest(local, 20, objects={**doc["objects"], "pod-1.json": sha256_hex(other)})
    assert _refusal(store, 20) == (
        f"{_uri(store, 20, 'pod-1.json')} has fingerprint eeeeeeeeeeeeeeee..., but "
        f"{_uri(store, 20, 'MANIFEST.json')} lists ffffffffffffffff...; the checkpoint will "
        f"not be used")


def test_a_lane_whose_state_is_not_the_listed_one_is_refused(local: Backend,
                                                            store: CheckpointStore) -> None:
    doc = json.loads(local.read(20, "MANIFEST.json"))
    doc["lanes"]["6"]["sha256"] = "1" * 64
    _edit_manifest(local, 20, lanes=doc["lanes"])
    assert _refusal(store, 20) == (
        f"lane 6 in {_uri(store, 20, 'pod-1.json')} does not match the SHA-256 that "
        f"{_uri(store, 20, 'MANIFEST.json')} lists for it; the checkpoint will not be used")


def test_a_manifest_that_is_not_its_objects_names_the_fields(local: Backend,
                                                             store: CheckpointStore) -> None:
    muri = _uri(store, 20, "MANIFEST.json")
    _edit_manifest(local, 20, fingerprint_doc={"recipe": {}},
                   phases=[{"name": "all", "start_step": 0}])
    assert _refusal(store, 20) == (
        f"manifest {muri} does not match the pod objects it lists (differs in: "
        f"fingerprint_doc, phases); it was altered after commit and will not be used")
    # the same fields in another spelling (indented): only the encoding differs
    doc = json.loads(local.read(20, "MANIFEST.json"))
    doc["fingerprint_doc"] = FP_DOC
    del doc["phases"]
    local.write(20, "MANIFEST.json", json.dumps(doc, sort_keys=True, indent=1).encode())
    assert _refusal(store, 20) == (
        f"manifest {muri} does not match the pod objects it lists (differs in: encoding); it "
        f"was altered after commit and will not be used")


def test_a_restore_of_no_lanes_or_a_lane_outside_the_step(store: CheckpointStore) -> None:
    none = store.load(20, lanes=[])
    assert (none.step, none.lanes, none.lanes_total) == (20, {}, 8)
    assert store.load(20, lanes=[7, 0, 7]).lanes == {0: lane_state(0, 20), 7: lane_state(7, 20)}
    for lane in (-1, 8):
        with pytest.raises(ConfigError) as err:
            store.load(20, lanes=[lane])
        assert str(err.value) == (f"lane {lane} is outside 0..7 of the checkpoint of step 20 "
                                  f"in {store.uri}")


def test_a_committed_step_cannot_be_discarded(local: Backend, store: CheckpointStore) -> None:
    with pytest.raises(ConfigError) as err:
        store.discard(20)
    assert str(err.value) == (f"step 20 is committed in {store.uri}; only uncommitted steps can "
                              f"be discarded (committed ones go with gc)")
    write_step(store, 30, skip=(1,))
    assert store.is_committed(20) and not store.is_committed(30)
    store.discard(30)
    assert local.names(30) == [] and local.names(20) == ["MANIFEST.json", "pod-0.json",
                                                         "pod-1.json"]
    assert store.pod_uri(30, 1) == _uri(store, 30, "pod-1.json")


def test_an_object_that_is_not_the_listed_bytes_names_both_hashes(
        local: Backend, store: CheckpointStore) -> None:
    listed = sha256_hex(local.read(20, "pod-1.json"))
    local.write(20, "pod-1.json", b"x")  # sha256(b"x") = 2d711642b726b044...
    assert _refusal(store, 20) == (
        f"corrupt object {_uri(store, 20, 'pod-1.json')}: its 1 bytes hash to "
        f"2d711642b726b044..., but {_uri(store, 20, 'MANIFEST.json')} lists {listed[:16]}...; "
        f"the object is truncated or altered and will not be used")

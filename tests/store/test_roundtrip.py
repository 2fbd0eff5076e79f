"""Write, commit and load checkpoints on local paths, ``file://`` URIs and S3."""

from __future__ import annotations

import json

import pytest

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.state import Checkpoint
from datalane.store import MANIFEST_FORMAT, POD_STATE_FORMAT, NoCheckpointError

from .conftest import Backend
from .support import FINGERPRINT, FP_DOC, LANES, commit_steps, global_of, lane_state, write_step


def test_round_trip(backend: Backend) -> None:
    store = backend.store()
    write_step(store, 10, pods=2)
    manifest = store.commit(10)
    assert manifest is not None and manifest.step == 10
    ckpt = store.load(10)
    assert isinstance(ckpt, Checkpoint)
    assert (ckpt.step, ckpt.fingerprint, ckpt.lanes_total) == (10, FINGERPRINT, LANES)
    assert ckpt.fingerprint_doc == FP_DOC
    assert ckpt.lanes == {lane: lane_state(lane, 10) for lane in range(LANES)}
    assert store.committed_steps() == [10]
    assert store.latest_committed() == 10


def test_layout_on_storage(backend: Backend) -> None:
    store = backend.store()
    uri = store.write_pod(10, 0, {0: lane_state(0, 10), 1: lane_state(1, 10)}, {},
                          FINGERPRINT, FP_DOC, 2)
    assert uri == f"{store.uri}/steps/000000000010/pod-0.json"
    assert store.uri.startswith("s3://" if backend.kind == "s3" else "file:///")
    store.commit(10)
    assert backend.names(10) == ["MANIFEST.json", "pod-0.json"]
    pod = json.loads(backend.read(10, "pod-0.json"))
    assert pod["format"] == POD_STATE_FORMAT
    assert sorted(pod) == ["digests", "fingerprint", "fingerprint_doc", "format", "lanes",
                           "lanes_total", "pod", "step"]
    manifest = json.loads(backend.read(10, "MANIFEST.json"))
    assert manifest["format"] == MANIFEST_FORMAT
    assert manifest["lanes"]["1"]["object"] == "pod-0.json"
    assert manifest["previous"] == {"step": None, "sha256": None}


def test_partial_restore_reads_only_needed_objects(backend: Backend) -> None:
    store = backend.store()
    write_step(store, 4, pods=4)
    store.commit(4)
    backend.write(4, "pod-0.json", b"garbage")  # lanes 0-1 now corrupt: not read below
    ckpt = store.load(4, lanes=[6, 7, 4])
    assert sorted(ckpt.lanes) == [4, 6, 7]
    assert ckpt.lanes_total == LANES
    with pytest.raises(ConfigError, match=r"lane 8 is outside 0\.\.7"):
        store.load(4, lanes=[8])


def test_ledger_and_chain(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [5, 10, 20])
    first, second, third = (store.manifest(s) for s in (5, 10, 20))
    assert first.ledger == tuple((s, global_of(s)) for s in range(5))
    assert second.ledger == tuple((s, global_of(s)) for s in range(5, 10))
    assert third.ledger == tuple((s, global_of(s)) for s in range(10, 20))
    assert (first.previous_step, first.previous_sha256) == (None, None)
    import hashlib
    assert third.previous_step == 10
    assert third.previous_sha256 == hashlib.sha256(backend.read(10, "MANIFEST.json")).hexdigest()


def test_missing_step_error_lists_committed(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10, 20, 30])
    with pytest.raises(NoCheckpointError) as err:
        store.load(40)
    assert str(err.value) == (f"step 40 has no committed checkpoint in {store.uri}; "
                              f"committed steps: 10, 20, 30")
    write_step(store, 40, skip=(1,))
    with pytest.raises(NoCheckpointError, match="pod objects but was never committed"):
        store.load(40)
    empty = Backend(backend.kind, backend.uri + "-empty", backend.options).store()
    with pytest.raises(ConfigError, match="committed steps: none"):
        empty.load(1)
    assert empty.latest_committed() is None and empty.committed_steps() == []


def test_fingerprint_mismatch_names_fields(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [3])
    other = {"recipe": {"seed": 6, "lanes": LANES}, "files": {}}
    with pytest.raises(MismatchError, match=r"recipe.seed: saved 5, now 6"):
        store.load(3, fingerprint="e" * 64, fingerprint_doc=other)
    assert store.load(3, fingerprint=FINGERPRINT, fingerprint_doc=FP_DOC).step == 3


def test_write_pod_validates(local: Backend) -> None:
    store = local.store()
    state = {0: lane_state(0, 3)}
    with pytest.raises(ConfigError, match="pod id 'a/b'"):
        store.write_pod(3, "a/b", state, {}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(ConfigError, match="holds the state of lane 0"):
        store.write_pod(3, 0, {1: lane_state(0, 3)}, {}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(ConfigError, match=r"outside 0\.\.7"):
        store.write_pod(3, 0, {9: lane_state(9, 3)}, {}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(ConfigError, match=r"can only carry steps 0\.\.2"):
        store.write_pod(3, 0, state, {3: {0: b"\0" * 32}}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(ConfigError, match="32-byte"):
        store.write_pod(3, 0, state, {2: {0: b"short"}}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(ConfigError, match="checkpoint step"):
        store.write_pod(-1, 0, state, {}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(ConfigError, match="no lane state"):
        store.write_pod(3, 0, {}, {}, FINGERPRINT, FP_DOC, LANES)
    assert local.names(3) == []


def test_rewrite_of_committed_step(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [6])
    before = backend.read(6, "MANIFEST.json")
    # Same states (another topology reaching the same step): accepted, nothing written.
    uri = store.write_pod(6, "new-pod", {3: lane_state(3, 6)}, {}, FINGERPRINT, FP_DOC, LANES)
    assert uri.endswith("/MANIFEST.json")
    assert backend.names(6) == ["MANIFEST.json", "pod-0.json", "pod-1.json"]
    with pytest.raises(MismatchError, match=r"lanes \[3\] differ"):
        store.write_pod(6, 1, {3: lane_state(3, 7)}, {}, FINGERPRINT, FP_DOC, LANES)
    with pytest.raises(MismatchError, match="fingerprint"):
        store.write_pod(6, 1, {3: lane_state(3, 6)}, {}, "0" * 64, FP_DOC, LANES)
    assert backend.read(6, "MANIFEST.json") == before
    assert store.load(6).lanes[3] == lane_state(3, 6)


def test_commit_is_idempotent(backend: Backend) -> None:
    store = backend.store()
    write_step(store, 2)
    first = store.commit(2)
    data = backend.read(2, "MANIFEST.json")
    assert store.commit(2) == first
    assert backend.read(2, "MANIFEST.json") == data
    assert first is not None and first.encode() == data

"""Corrupt, truncated or tampered checkpoints are detected by hash and never used."""

from __future__ import annotations

import json

import pytest

from datalane.spec.errors import StorageError
from datalane.store import CheckpointStore

from .conftest import Backend
from .support import commit_steps


def _object_uri(store: CheckpointStore, step: int, name: str) -> str:
    return f"{store.uri}/steps/{step:012d}/{name}"


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _assert_refused(store: CheckpointStore, step: int, names: str,
                    commit_heals: bool = False) -> StorageError:
    """load, manifest() and commit() all refuse the step with an error naming ``names``."""
    with pytest.raises(StorageError) as err:
        store.load(step)
    assert names in str(err.value)
    assert err.value.transient is False
    with pytest.raises(StorageError, match=r"will not be used|corrupt"):
        store.manifest(step)
    assert step not in store.committed_steps(verify=True)
    if not commit_heals:
        with pytest.raises(StorageError, match=r"will not be used|corrupt"):
            store.commit(step)
    return err.value


def test_flipped_byte_in_pod_object(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10, 20])
    data = backend.read(20, "pod-1.json")
    backend.write(20, "pod-1.json", _flip(data, len(data) // 2))
    err = _assert_refused(store, 20, _object_uri(store, 20, "pod-1.json"))
    assert "corrupt object" in str(err)
    assert store.latest_committed() == 20  # cheap listing: a manifest is there
    assert store.latest_committed(verify=True) == 10  # the newest that verifies
    assert store.load(10).step == 10


def test_truncated_pod_object(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10])
    data = backend.read(10, "pod-0.json")
    backend.write(10, "pod-0.json", data[: len(data) - 40])
    err = _assert_refused(store, 10, _object_uri(store, 10, "pod-0.json"))
    assert f"its {len(data) - 40} bytes" in str(err)
    # A restore of the other pod's lanes only reads the intact object.
    assert sorted(store.load(10, lanes=[4, 5]).lanes) == [4, 5]
    with pytest.raises(StorageError, match=r"pod-0\.json"):
        store.load(10, lanes=[0])


def test_missing_pod_object(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10])
    backend.delete(10, "pod-1.json")
    err = _assert_refused(store, 10, _object_uri(store, 10, "pod-1.json"))
    assert "does not exist" in str(err)


def test_tampered_manifest_ledger(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10])
    doc = json.loads(backend.read(10, "MANIFEST.json"))
    doc["ledger"][3][1] = "0" * 64
    backend.write(10, "MANIFEST.json",
                  json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    err = _assert_refused(store, 10, _object_uri(store, 10, "MANIFEST.json"))
    assert "differs in: ledger" in str(err)


def test_tampered_manifest_lane_hash(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10])
    doc = json.loads(backend.read(10, "MANIFEST.json"))
    doc["lanes"]["5"]["sha256"] = "1" * 64
    backend.write(10, "MANIFEST.json", json.dumps(doc).encode())
    err = _assert_refused(store, 10, _object_uri(store, 10, "MANIFEST.json"))
    assert "lane 5" in str(err) and _object_uri(store, 10, "pod-1.json") in str(err)


def test_tampered_manifest_lane_map(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    doc = json.loads(local.read(10, "MANIFEST.json"))
    doc["lanes"]["0"], doc["lanes"]["4"] = doc["lanes"]["4"], doc["lanes"]["0"]
    local.write(10, "MANIFEST.json", json.dumps(doc).encode())
    _assert_refused(store, 10, _object_uri(store, 10, "MANIFEST.json"))


def test_garbled_and_truncated_manifest(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    data = local.read(10, "MANIFEST.json")
    local.write(10, "MANIFEST.json", data[: len(data) // 2])
    err = _assert_refused(store, 10, _object_uri(store, 10, "MANIFEST.json"), commit_heals=True)
    assert "not valid JSON" in str(err) and "truncated" in str(err)
    local.write(10, "MANIFEST.json", b'{"format": "datalane.manifest/v1"}')
    _assert_refused(store, 10, _object_uri(store, 10, "MANIFEST.json"), commit_heals=True)
    # An unparseable manifest records nothing; commit derives it again from the objects.
    assert store.commit(10) is not None
    assert local.read(10, "MANIFEST.json") == data
    assert store.load(10).step == 10


def test_object_swapped_between_steps(local: Backend) -> None:
    """A pod object of another step, even with a manifest rewritten to its hash, is refused."""
    store = local.store()
    commit_steps(store, [10, 20])
    local.write(20, "pod-0.json", local.read(10, "pod-0.json"))
    _assert_refused(store, 20, _object_uri(store, 20, "pod-0.json"))

"""Garbage collection never deletes the checkpoint a restore would fall back to, and records
exactly what it removes.

``gc(keep)`` keeps the newest ``keep`` committed steps and, when those do not verify, the
newest one that does; before it deletes a committed step it writes a gc record listing it
(the audit tells a collection from a deletion by hand by it). A collection of uncommitted
steps only writes no record. Local files only.
"""

from __future__ import annotations

import json
import logging

import pytest

from datalane.spec.errors import StorageError
from datalane.store import CheckpointStore

from .conftest import Backend
from .faults import FaultyFS
from .support import commit_steps, write_step


def _corrupt(local: Backend, step: int) -> None:
    data = local.read(step, "pod-1.json")
    local.write(step, "pod-1.json", data[:-10])


def _records(local: Backend) -> dict[str, dict[str, object]]:
    local.fs.invalidate_cache()
    root = f"{local.base}/gc"
    if not local.fs.exists(root):
        return {}
    return {p.rsplit("/", 1)[-1]: json.loads(local.fs.cat_file(p)) for p in local.fs.find(root)}


def test_the_newest_checkpoint_that_verifies_is_kept(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20, 30])
    _corrupt(local, 30)
    assert store.gc(keep=1) == [10]  # 30 is the newest, 20 the newest a restore can use
    assert store.committed_steps() == [20, 30]
    assert store.latest_committed(verify=True) == 20
    assert store.load(20).step == 20
    record = _records(local)[f"{10:012d}.json"]
    assert record["kept"] == [20, 30]
    assert [e["step"] for e in record["removed"]] == [10]  # type: ignore[union-attr]


def test_a_corrupt_step_between_is_collected_and_the_older_usable_one_kept(
        local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20, 30])
    _corrupt(local, 30)
    _corrupt(local, 20)
    assert store.gc(keep=1) == [20]
    assert store.committed_steps() == [10, 30]
    assert store.load(10).step == 10
    assert _records(local)[f"{20:012d}.json"]["kept"] == [10, 30]


def test_a_collection_of_uncommitted_steps_only_writes_no_record(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20])
    write_step(store, 15, skip=(1,))  # abandoned below the newest committed step
    assert store.gc(keep=2) == [15]
    assert _records(local) == {}
    assert store.committed_steps() == [10, 20]
    assert store.audit().ok


def test_gc_records_are_read_by_their_json_files_and_a_broken_one_is_named(
        local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20, 30])
    assert store.gc(keep=1) == [10, 20]
    local.fs.pipe_file(f"{local.base}/gc/README.txt", b"not a record")
    report = store.audit()
    assert report.ok, report.text()
    broken = f"{store.uri}/gc/{5:012d}.json"
    local.fs.pipe_file(f"{local.base}/gc/{5:012d}.json", b'{"format": "datalane.gc')
    report = CheckpointStore(store.uri).audit()
    assert report.problems == (
        f"gc record {broken} is not valid JSON (23 bytes); the steps it lists as removed are "
        f"not accounted for",)


def test_a_transient_read_fault_is_raised_not_taken_for_a_broken_checkpoint(
        local: Backend) -> None:
    """A checkpoint that could not be read (503) is not one that does not verify: neither the
    newest usable step, nor the audit, nor gc may act as if it were broken."""
    store = local.store()
    commit_steps(store, [10, 20])
    faulty = local.store(filesystem=FaultyFS(local.fs).always_fail("cat_file", "server_error"),
                         retries=0)
    for call in (lambda: faulty.latest_committed(verify=True),
                 lambda: faulty.committed_steps(verify=True),
                 lambda: faulty.gc(keep=1), faulty.audit):
        with pytest.raises(StorageError) as err:
            call()
        assert err.value.transient is True
        assert "Please reduce your request rate" in str(err.value)
    assert store.committed_steps(verify=True) == [10, 20]


def test_a_collection_interrupted_and_run_again_keeps_every_removed_step_recorded(
        local: Backend) -> None:
    """gc of 10, 20 and 30 dies after deleting steps 10 and 20, before step 30's manifest; the
    next gc removes step 30 alone. Its record has the same name as the first one (the newest
    step removed): it must still list steps 10 and 20 (with 20's link to 10), or the audit
    reports the oldest steps deleted."""
    key = b"k" * 32
    store = local.store(ledger_key=key)
    commit_steps(store, [10, 20, 30, 40])
    io = store._io  # the crash is injected at the object layer
    real = io.delete
    doomed_manifest = f"{local.base}/steps/{30:012d}/MANIFEST.json"

    def crash(path: str) -> None:
        if path == doomed_manifest:
            raise KeyboardInterrupt  # the process dies here
        real(path)

    io.delete = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        store.gc(keep=1)
    assert local.names(10) == local.names(20) == [] and "MANIFEST.json" in local.names(30)
    again = local.store(ledger_key=key)
    assert again.gc(keep=1) == [30]
    removed: list[dict[str, object]] = _records(local)[f"{30:012d}.json"]["removed"]  # type: ignore[assignment]
    assert [e["step"] for e in removed] == [10, 20, 30]
    assert [e["previous"] for e in removed] == [None, {"step": 10, "sha256": removed[0]["sha256"]},
                                                {"step": 20, "sha256": removed[1]["sha256"]}]
    report = again.audit(key=key)
    assert report.ok, report.text()
    assert report.history[1] == (
        f"history: complete back to the first checkpoint; 3 checkpoints before step 40 were "
        f"garbage-collected (steps 10, 20, 30; {again.uri}/gc/{30:012d}.json)")


def test_an_unsigned_record_under_a_collections_name_is_not_carried_into_its_record(
        local: Backend) -> None:
    """A writer without the key plants gc/<20>.json listing a step; the keyed gc that then
    writes the record of that name does not sign what it did not remove."""
    key = b"k" * 32
    store = local.store(ledger_key=key)
    commit_steps(store, [10, 20, 30])
    planted = {"format": "datalane.gc-record/v1", "kept": [], "removed": [
        {"step": 5, "sha256": "5" * 64, "seq": 0, "previous": None}]}
    local.fs.makedirs(f"{local.base}/gc", exist_ok=True)
    local.fs.pipe_file(f"{local.base}/gc/{20:012d}.json", json.dumps(planted).encode())
    assert store.gc(keep=1) == [10, 20]
    record = _records(local)[f"{20:012d}.json"]
    assert [e["step"] for e in record["removed"]] == [10, 20]  # type: ignore[union-attr]
    assert store.audit(key=key).ok


def test_a_collection_is_logged_with_what_it_kept_and_deleted(
        local: Backend, caplog: pytest.LogCaptureFixture) -> None:
    store = local.store()
    commit_steps(store, [10, 20, 30])
    write_step(store, 25, skip=(1,))
    with caplog.at_level(logging.INFO, logger="datalane.store"):
        assert store.gc(keep=1) == [10, 20, 25]
        assert store.gc(keep=1) == []  # nothing to do: nothing logged
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("gc")] == [
        f"gc of {store.uri}: kept steps 30, deleted steps 10, 20, 25"]

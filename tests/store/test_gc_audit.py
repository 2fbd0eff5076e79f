"""Garbage collection keeps the newest N; the audit verifies the hash chain and the ledger."""

from __future__ import annotations

import json

import pytest

from datalane.spec.errors import ConfigError
from datalane.store import AuditReport

from .conftest import Backend
from .support import commit_steps, global_of, write_pod, write_step


def test_gc_keeps_newest(backend: Backend) -> None:
    store = backend.store()
    commit_steps(store, [10, 20, 30, 40])
    write_step(store, 25, skip=(1,))  # abandoned, older than the newest committed
    write_step(store, 50, skip=(1,))  # in progress, newer: kept
    assert store.gc(keep=2) == [10, 20, 25]
    assert store.committed_steps() == [30, 40]
    assert backend.names(10) == [] and backend.names(25) == []
    assert backend.names(50) == ["pod-0.json"]
    assert store.load(30).step == 30 and store.load(40).step == 40
    assert store.gc(keep=2) == []
    assert store.gc(keep=1) == [30]
    assert store.committed_steps() == [40]
    report = store.audit()
    assert report.ok, report.text()
    assert any("garbage-collected" in n for n in report.entries[0].notes)
    # The chain continues after gc: the next commit links to the newest kept manifest.
    write_step(store, 50, since=40)
    assert store.commit(50) is not None
    assert store.audit().ok


def test_gc_never_deletes_the_newest(local: Backend) -> None:
    store = local.store()
    assert store.gc(keep=1) == []  # empty store
    write_step(store, 5, skip=(0,))
    assert store.gc(keep=1) == []  # nothing committed: nothing is older than "newest"
    commit_steps(store, [10])
    assert store.gc(keep=1) == [5]
    assert store.committed_steps() == [10]
    for bad in (0, -1, True):
        with pytest.raises(ConfigError, match="keep must be >= 1"):
            store.gc(keep=bad)  # type: ignore[arg-type]


def _intact(backend: Backend) -> AuditReport:
    store = backend.store()
    commit_steps(store, [10, 20, 30])
    report = store.audit()
    assert report.ok, report.text()
    return report


def test_audit_of_intact_store(backend: Backend) -> None:
    report = _intact(backend)
    assert [e.step for e in report.entries] == [10, 20, 30]
    assert [e.previous_step for e in report.entries] == [None, 10, 20]
    assert report.ledger == tuple((s, global_of(s)) for s in range(30))
    text = report.text()
    assert "3 committed checkpoints (steps 10, 20, 30)" in text
    assert f"       17  {global_of(17)}" in text
    assert text.splitlines()[-1] == ("OK: 3 checkpoints verified, hash chain intact, ledger "
                                    "continuous over steps 0-29")
    doc = report.to_json()
    assert doc["ok"] is True and len(doc["ledger"]) == 30
    json.dumps(doc)


def test_audit_detects_deleted_manifest(backend: Backend) -> None:
    _intact(backend)
    backend.delete(20, "MANIFEST.json")
    report = backend.store().audit()
    assert not report.ok
    assert [e.step for e in report.entries] == [10, 30]
    assert report.uncommitted == (20,)
    problems = report.all_problems()
    assert any("step 30: broken hash chain: links to step 20, whose manifest is missing" in p
               for p in problems), problems
    assert any("ledger gap: no global batch hash for steps 10-19" in p for p in problems)
    assert report.text().splitlines()[-1].startswith("FAILED")


def test_audit_detects_replaced_manifest(backend: Backend) -> None:
    """A manifest rewritten after the next one linked to it breaks the chain."""
    _intact(backend)
    doc = json.loads(backend.read(20, "MANIFEST.json"))
    doc["ledger"][0][1] = "0" * 64
    backend.write(20, "MANIFEST.json",
                  json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    report = backend.store().audit()
    assert not report.ok
    by_step = {e.step: e for e in report.entries}
    assert by_step[10].ok
    assert any("does not match the pod objects" in p for p in by_step[20].problems)
    assert any("broken hash chain: links to step 20" in p and "replaced or altered" in p
               for p in by_step[30].problems)


def test_audit_detects_corrupt_object(local: Backend) -> None:
    _intact(local)
    data = local.read(10, "pod-1.json")
    local.write(10, "pod-1.json", data[:-10])
    report = local.store().audit()
    assert [e.ok for e in report.entries] == [False, True, True]
    assert "pod-1.json" in report.entries[0].problems[0]


def test_audit_detects_ledger_gap(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10])
    for pod in range(2):
        write_pod(store, 20, pod, 2, 15)  # digests only since step 15
    assert store.commit(20) is not None
    report = store.audit()
    assert not report.ok
    assert report.problems == ("ledger gap: no global batch hash for steps 10-14",)


def test_audit_of_a_store_that_does_not_exist_fails_naming_it(backend: Backend) -> None:
    """A wrong URI is no store (it audited as 'OK: 0 checkpoints verified')."""
    store = backend.store()  # nothing was ever written under it
    report = store.audit()
    problem = (f"there is no checkpoint store at {store.uri}: nothing is stored under it "
               f"(check the URI, and the bucket and prefix)")
    assert not report.ok and report.entries == () and report.problems == (problem,)
    assert report.text().splitlines()[-2:] == [f"problem: {problem}", "FAILED: 1 problems"]
    commit_steps(store, [10])  # once a checkpoint is there, it audits fine
    assert store.audit().ok

"""A cut head or tail of a store's history is evident.

The tester's repro: deleting the newest or the oldest steps of a signed ledger passed
``datalane audit --key``. ``HEAD.json`` names the newest committed step, garbage collection
writes a signed record of what it removes, and manifests count their place in the chain, so
the audit reports removed newest and oldest steps and tells them from a garbage collection.
A store of a datalane before these records audits as before, saying what cannot be proven.
Runs on local paths, ``file://`` and moto S3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from datalane.store import CheckpointStore

from .conftest import Backend
from .support import commit_steps, write_step

KEY = b"k" * 32


def _delete_step(backend: Backend, step: int) -> None:
    for name in backend.names(step):
        backend.delete(step, name)


def _remove(backend: Backend, name: str) -> None:
    backend.fs.rm(f"{backend.base}/{name}")


def test_removing_the_newest_steps_is_evident(backend: Backend) -> None:
    store = backend.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30, 40])
    assert store.audit(key=KEY).ok
    _delete_step(backend, 40)
    _delete_step(backend, 30)
    report = store.audit(key=KEY)
    assert not report.ok
    head = json.loads(backend.fs.cat_file(f"{backend.base}/HEAD.json"))
    assert report.problems == (
        f"the newest checkpoints were removed: {store.uri}/HEAD.json names step 40 (manifest "
        f"{head['sha256'][:16]}...), which is not in the store; the newest present is step 20",)
    assert all(e.ok for e in report.entries)  # what is left verifies: only HEAD.json tells


def test_removing_the_oldest_steps_is_evident(backend: Backend) -> None:
    store = backend.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30, 40])
    _delete_step(backend, 10)
    _delete_step(backend, 20)
    report = store.audit(key=KEY)
    assert not report.ok
    assert report.problems == (
        "the oldest checkpoints were removed: step 30 links to step 20, which is not in the "
        "store, and no gc record says it was garbage-collected (2 checkpoints came before "
        "step 30)",)


def test_garbage_collection_is_told_from_a_deletion(backend: Backend) -> None:
    store = backend.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30, 40])
    assert store.gc(keep=2) == [10, 20]
    record = f"{store.uri}/gc/{20:012d}.json"
    report = store.audit(key=KEY)
    assert report.ok, report.text()
    assert report.history == (
        "head: step 40, as " + f"{store.uri}/HEAD.json records",
        "history: complete back to the first checkpoint; 2 checkpoints before step 30 were "
        f"garbage-collected (steps 10, 20; {record})")
    assert report.entries[0].notes == (f"links to step 20, garbage-collected ({record})",)
    write_step(store, 50, since=40)  # the run goes on, and gc again
    assert store.commit(50) is not None
    assert store.gc(keep=1) == [30, 40]
    report = store.audit(key=KEY)
    assert report.ok, report.text()
    assert report.history[1] == (
        f"history: complete back to the first checkpoint; 4 checkpoints before step 50 were "
        f"garbage-collected (steps 10, 20, 30, 40; {record}, {store.uri}/gc/{40:012d}.json)")
    doc = json.loads(backend.fs.cat_file(f"{backend.base}/gc/{40:012d}.json"))
    assert [e["step"] for e in doc["removed"]] == [30, 40] and doc["kept"] == [50]
    assert [e["seq"] for e in doc["removed"]] == [2, 3]


def test_a_gc_record_forged_without_the_key_does_not_cover_a_deletion(local: Backend) -> None:
    store = local.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30])
    keyless = local.store(ledger_key=None)  # an attacker: bucket access, no key
    assert keyless.gc(keep=1) == [10, 20]  # its gc record is unsigned
    assert keyless.audit().ok  # without the key a consistent rewrite cannot be told
    report = store.audit(key=KEY)
    record = f"{store.uri}/gc/{20:012d}.json"
    assert report.problems == (
        f"gc record {record} is not signed (written without a ledger key); the steps it lists "
        f"as removed are not accounted for",
        "the oldest checkpoints were removed: step 30 links to step 20, which is not in the "
        "store, and no gc record says it was garbage-collected (2 checkpoints came before "
        "step 30)")


def test_a_deleted_head_record_is_evident(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20])
    _remove(local, "HEAD.json")
    report = store.audit()
    assert report.problems == (
        f"{store.uri}/HEAD.json is missing, although this store's checkpoints were committed "
        f"by a datalane that writes it: it was deleted, and whether the newest checkpoints "
        f"were too cannot be proven",)
    write_step(store, 30, since=20)  # the next commit writes it again
    assert store.commit(30) is not None
    assert store.audit().ok


def test_the_chain_counts_and_the_head_follows_commits(local: Backend) -> None:
    store = local.store()
    commit_steps(store, [10, 20, 30])
    assert [store.manifest(s).seq for s in (10, 20, 30)] == [0, 1, 2]
    head = json.loads((Path(local.base) / "HEAD.json").read_text())
    manifest = (Path(local.base) / "steps" / f"{30:012d}" / "MANIFEST.json").read_bytes()
    import hashlib

    assert head == {"format": "datalane.head/v1", "step": 30, "seq": 2,
                    "sha256": hashlib.sha256(manifest).hexdigest()}
    write_step(store, 25, since=20)  # committed out of order: HEAD.json stays at 30
    assert store.commit(25) is not None
    assert json.loads((Path(local.base) / "HEAD.json").read_text())["step"] == 30


def _old_datalane(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commit and collect as an older datalane did: no seq, no HEAD.json, no gc record."""
    from datalane.store import store as module

    real = module.build_manifest
    monkeypatch.setattr(module, "build_manifest",
                        lambda step, pods, previous, seq=None: real(step, pods, previous))
    monkeypatch.setattr(CheckpointStore, "_advance_head", lambda *a: None)
    monkeypatch.setattr(CheckpointStore, "_record_gc", lambda *a: None)


def test_an_old_store_audits_saying_what_cannot_be_proven(local: Backend,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          ) -> None:
    with monkeypatch.context() as m:
        _old_datalane(m)
        old = local.store()
        commit_steps(old, [10, 20, 30])
        assert old.manifest(30).seq is None
        assert old.gc(keep=2) == [10]
    report = local.store().audit()
    assert report.ok, report.text()
    assert report.history == (
        f"head: no {local.store().uri}/HEAD.json (checkpoints of a datalane before it was "
        f"kept): whether the newest checkpoints were removed cannot be proven; compare step "
        f"30 with a record kept elsewhere",
        "history: step 20 links to step 10, which is not in the store and was removed before "
        "gc records were kept (or by hand): what came before step 20 cannot be proven")
    # the run goes on under this datalane: its first manifest starts the count, and HEAD.json
    store = local.store()
    write_step(store, 40, since=30)
    assert store.commit(40) is not None
    assert store.manifest(40).seq == 0
    report = store.audit()
    assert report.ok, report.text()
    assert report.history[0] == f"head: step 40, as {store.uri}/HEAD.json records"
    assert store.gc(keep=1) == [20, 30]  # old manifests in a gc record: seq null
    report = store.audit()
    assert report.ok, report.text()
    assert report.history[1].startswith(
        "history: step 20 links to step 10, which is not in the store and was removed before "
        "gc records were kept (or by hand): what came before step 20 cannot be proven; 2 "
        "checkpoints before step 40 were garbage-collected (steps 20, 30; ")


def test_the_cli_prints_the_head_and_the_history(local: Backend, tmp_path: Path) -> None:
    store = local.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30])
    assert store.gc(keep=1) == [10, 20]
    key = tmp_path / "key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    proc = subprocess.run([sys.executable, "-m", "datalane.cli", "audit", store.uri, "--key",
                           str(key)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert f"head: step 30, as {store.uri}/HEAD.json records" in lines
    assert ("history: complete back to the first checkpoint; 2 checkpoints before step 30 "
            f"were garbage-collected (steps 10, 20; {store.uri}/gc/{20:012d}.json)") in lines
    _delete_step(local, 30)  # every checkpoint gone, the pod objects of a step left
    write_step(store, 40, since=30)
    proc = subprocess.run([sys.executable, "-m", "datalane.cli", "audit", store.uri, "--key",
                           str(key)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert (f"problem: the newest checkpoints were removed: {store.uri}/HEAD.json names step "
            f"30 (manifest ") in proc.stdout
    assert "which is not in the store; no committed checkpoint is left" in proc.stdout

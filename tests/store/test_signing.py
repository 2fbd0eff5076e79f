"""HMAC-signed manifests: a writer without the key cannot forge history.

The hash chain alone is consistent for anyone who can write the bucket: the forgery test
rebuilds two steps with the store's own code and the keyless audit passes, while the audit
with the ledger key names the forged steps. Runs on local paths, ``file://`` and moto S3.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from datalane.spec.errors import ConfigError
from datalane.store import CheckpointStore, read_ledger_key
from datalane.store.signing import key_id, sign_manifest

from .conftest import Backend
from .support import commit_steps, lane_state, pod_lanes, write_step

KEY = b"k" * 32
OTHER = b"o" * 32


def _forge(backend: Backend, step: int, since: int | None) -> None:
    """What an attacker with bucket access but no key does: replace a committed step's lane
    states and commit it again, keeping the (old) signature in place."""
    backend.delete(step, "MANIFEST.json")
    attacker = backend.store(ledger_key=None)  # no key in this environment
    for pod in range(2):
        own = pod_lanes(pod, 2)
        lanes = {lane: lane_state(lane, step + 1) for lane in own}  # other positions
        digests = {s: {lane: bytes(32) for lane in own} for s in range(since or 0, step)}
        attacker.write_pod(step, pod, lanes, digests, "f" * 64, None, 8)
    assert attacker.commit(step) is not None


def test_signed_store_audits_with_the_key_and_without(backend: Backend) -> None:
    store = backend.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30])
    assert backend.names(20) == ["MANIFEST.json", "MANIFEST.sig", "pod-0.json", "pod-1.json"]
    manifest = backend.read(20, "MANIFEST.json")
    assert backend.read(20, "MANIFEST.sig") == sign_manifest(KEY, 20, manifest)
    report = store.audit(key=KEY)
    assert report.ok, report.text()
    assert report.key_id == key_id(KEY)
    assert (f"hash chain intact, every manifest signed with ledger key {key_id(KEY)}, ledger "
            f"continuous over steps 0-29") in report.text()
    assert store.audit().ok  # a reader without the key sees a plain store


def test_signing_leaves_the_manifests_unchanged(tmp_path: Path) -> None:
    signed, plain = CheckpointStore(str(tmp_path / "a"), ledger_key=KEY), CheckpointStore(
        str(tmp_path / "b"))
    commit_steps(signed, [10, 20])
    commit_steps(plain, [10, 20])
    for step in (10, 20):
        name = f"steps/{step:012d}/MANIFEST.json"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_forged_history_passes_the_chain_but_not_the_key(backend: Backend) -> None:
    store = backend.store(ledger_key=KEY)
    commit_steps(store, [10, 20, 30])
    _forge(backend, 20, 10)
    _forge(backend, 30, 20)  # relinks the chain to the forged step 20
    assert store.audit().ok  # consistent: the chain cannot tell
    report = store.audit(key=KEY)
    assert not report.ok
    sig = f"{store.uri}/steps/{{:012d}}/MANIFEST.sig"
    assert report.all_problems() == [
        f"step 20: the signature {sig.format(20)} does not match the manifest's bytes: the "
        f"manifest was forged or altered after it was signed",
        f"step 30: the signature {sig.format(30)} does not match the manifest's bytes: the "
        f"manifest was forged or altered after it was signed",
        f"the newest checkpoints cannot be proven present: {store.uri}/HEAD.json is not "
        f"signed (written without a ledger key)",  # the forger's commit rewrote it
    ]


def test_unsigned_and_foreign_signed_manifests_fail_naming_the_step(local: Backend) -> None:
    commit_steps(local.store(ledger_key=KEY), [10])
    unsigned = local.store(ledger_key=None)
    write_step(unsigned, 20, since=10)
    assert unsigned.commit(20) is not None  # committed by a sidecar without the key
    write_step(local.store(ledger_key=OTHER), 30, since=20)
    assert local.store(ledger_key=OTHER).commit(30) is not None
    report = local.store().audit(key=KEY)
    sig = f"{local.store().uri}/steps/{{:012d}}/MANIFEST.sig"
    assert report.all_problems() == [
        f"step 20: the manifest is not signed: {sig.format(20)} does not exist (committed "
        f"without a ledger key, or the signature was deleted)",
        f"step 30: the signature {sig.format(30)} was made with another key (key id "
        f"'{key_id(OTHER)}', the audit's key is {key_id(KEY)}), or forged",
        f"the newest checkpoints cannot be proven present: {local.store().uri}/HEAD.json was "
        f"signed with another key (key id '{key_id(OTHER)}', the audit's key is "
        f"{key_id(KEY)}), or forged",
    ]
    assert report.text().splitlines()[-1] == "FAILED: 3 problems"


def test_the_key_comes_from_a_file_or_the_environment(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "ledger-key"
    secret.write_bytes(KEY + b"\n")  # as `echo` writes it; the newline is not part of the key
    secret.chmod(0o600)  # readable by its owner only (a looser key file is refused)
    assert read_ledger_key(str(secret)) == KEY
    monkeypatch.setenv("DATALANE_LEDGER_KEY_FILE", str(secret))
    store = CheckpointStore(str(tmp_path / "s"))  # a sidecar picks the mounted Secret up
    commit_steps(store, [10])
    assert store.audit(key=KEY).ok
    monkeypatch.delenv("DATALANE_LEDGER_KEY_FILE")
    monkeypatch.setenv("DATALANE_LEDGER_KEY", OTHER.decode())
    from_env = CheckpointStore(str(tmp_path / "t"))
    commit_steps(from_env, [10])
    assert from_env.audit(key=OTHER).ok
    monkeypatch.setenv("DATALANE_LEDGER_KEY", "short")
    with pytest.raises(ConfigError) as info:
        CheckpointStore(str(tmp_path / "u"))
    assert str(info.value) == ("the ledger key from $DATALANE_LEDGER_KEY has 5 bytes; use at "
                               "least 16 (e.g. `head -c 32 /dev/urandom | base64`)")
    with pytest.raises(ConfigError, match="cannot read the ledger key file /nonexistent/key"):
        read_ledger_key("/nonexistent/key")


def _audit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datalane.cli", "audit", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_cli_audit_with_a_key_file(local: Backend, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    store = local.store(ledger_key=KEY)
    commit_steps(store, [10, 20])
    proc = _audit_cli(store.uri, "--key", str(key_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"every manifest signed with ledger key {key_id(KEY)}" in proc.stdout
    _forge(local, 20, 10)
    proc = _audit_cli(store.uri, "--key", str(key_file))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "FAILED: 2 problems"  # and the unsigned HEAD.json
    assert ("      problem: the signature " + f"{store.uri}/steps/000000000020/MANIFEST.sig "
            "does not match the manifest's bytes") in proc.stdout
    key_file.write_bytes(b"short")
    proc = _audit_cli(store.uri, "--key", str(key_file))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"datalane audit: error: the ledger key from the file {key_file} has "
                           f"5 bytes; use at least 16 (e.g. `head -c 32 /dev/urandom | "
                           f"base64`)\n")

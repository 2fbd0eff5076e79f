"""Restores check signatures, and a ledger key file must be private.

A store with a ledger key restores only a manifest its ``MANIFEST.sig`` vouches for: an
unsigned step, a forged one and one signed with another key are refused naming the
signature object. A key file that others may read is refused, naming the path, the mode and
the fix, as ssh refuses a private key.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from datalane.spec.errors import ConfigError, StorageError
from datalane.store import read_ledger_key, signing
from datalane.store.signing import key_id, sign_manifest

from .conftest import Backend
from .support import commit_steps, pod_lanes

KEY = b"k" * 32
OTHER = b"o" * 32


def test_a_keyed_store_restores_only_what_its_key_signed(backend: Backend) -> None:
    commit_steps(backend.store(ledger_key=KEY), [10, 20])
    store = backend.store(ledger_key=KEY)
    assert sorted(store.load(20).lanes) == list(range(8))  # signed with this key: restored
    sig = f"{store.uri}/steps/000000000020/MANIFEST.sig"
    backend.delete(20, "MANIFEST.sig")
    with pytest.raises(StorageError) as info:
        store.load(20, lanes=pod_lanes(0, 2))
    assert str(info.value) == (
        f"checkpoint step 20 in {store.uri} will not be restored with ledger key "
        f"{key_id(KEY)}: the manifest is not signed: {sig} does not exist (committed without "
        f"a ledger key, or the signature was deleted)")
    assert not info.value.transient
    backend.write(20, "MANIFEST.sig", sign_manifest(OTHER, 20, backend.read(20, "MANIFEST.json")))
    with pytest.raises(StorageError, match=r"MANIFEST\.sig was made with another key"):
        store.load(20)
    assert sorted(backend.store().load(20).lanes) == list(range(8))  # no key: hashes only


def test_a_forged_step_is_not_restored_by_a_keyed_store(local: Backend) -> None:
    commit_steps(local.store(ledger_key=KEY), [10, 20])
    signature = local.read(20, "MANIFEST.sig")
    local.delete(20, "MANIFEST.json")  # an attacker without the key commits other states
    attacker = local.store(ledger_key=None)
    from .support import lane_state

    for pod in range(2):
        own = pod_lanes(pod, 2)
        attacker.write_pod(20, pod, {lane: lane_state(lane, 21) for lane in own},
                           {s: {lane: bytes(32) for lane in own} for s in range(10, 20)},
                           "f" * 64, None, 8)
    assert attacker.commit(20) is not None
    local.write(20, "MANIFEST.sig", signature)  # the old signature left in place
    with pytest.raises(StorageError, match="does not match the manifest's bytes: the manifest "
                                           "was forged or altered after it was signed"):
        local.store(ledger_key=KEY).load(20)


def test_an_unsigned_history_is_refused_by_a_sidecar_environment(
        local: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The sidecar's store takes its key from the environment: the same check applies."""
    commit_steps(local.store(), [10])  # committed before a key was configured
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    monkeypatch.setenv("DATALANE_LEDGER_KEY_FILE", str(key_file))
    with pytest.raises(StorageError, match="the manifest is not signed"):
        local.store().load(10)


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640, 0o660, 0o620, 0o701],
                         ids=lambda m: f"{m:04o}")
def test_a_key_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    """The tester's repro: a 0644 key file was accepted silently."""
    path = tmp_path / "ledger.key"
    path.write_bytes(KEY)
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        read_ledger_key(str(path))
    who = "others" if mode & 0o007 else "its group"
    assert str(info.value) == (
        f"the ledger key file {path} has mode {mode:04o}: {who} may read or change it, and "
        f"whoever reads the key can sign anything; make it readable by its owner only: chmod "
        f"600 {path} (a Kubernetes Secret: defaultMode 0400, or 0440 with the pod's fsGroup)")


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=lambda m: f"{m:04o}")
def test_a_private_key_file_is_read(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "ledger.key"
    path.write_bytes(KEY + b"\n")
    path.chmod(mode)
    assert read_ledger_key(str(path)) == KEY


def test_a_kubernetes_secret_mount_is_accepted(tmp_path: Path) -> None:
    """A Secret volume for a non-root container: owned by root, group the pod's fsGroup, mode
    0440 (the kubelet adds group read to any defaultMode when fsGroup is set). The process is
    not the owner, and reads it through its group: as ssh, that is not refused."""
    mounted = "/etc/datalane/data-credentials/ledger.key"
    signing.check_key_file_mode(mounted, 0o100440, owner=0, me=1000)
    with pytest.raises(ConfigError, match="mode 0444: others may read"):
        signing.check_key_file_mode("/k", 0o100444, owner=0, me=1000)
    with pytest.raises(ConfigError, match="mode 0460: its group may read or change"):
        signing.check_key_file_mode("/k", 0o100460, owner=0, me=1000)
    if os.geteuid() == 0:  # as root, a file of another owner is the same case, on disk
        path = tmp_path / "mounted.key"
        path.write_bytes(KEY)
        os.chown(path, 1000, 1000)
        path.chmod(0o440)
        assert read_ledger_key(str(path)) == KEY

"""A sidecar with a ledger key resumes only from checkpoints its key signed.

Real sidecar processes: one commits checkpoint 3 of a store under the key (from a 0600 key
file, as a Kubernetes Secret mount gives it); a second resumes the trainer there. When the
step's signature is replaced by one of another key, or deleted, the resume is refused naming
the signature object. A sidecar whose key file others may read does not start.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from datalane.client.sidecar import SidecarLoader
from datalane.spec.errors import StorageError
from datalane.store import CheckpointStore
from datalane.store.signing import sign_manifest

pytestmark = pytest.mark.slow  # real sidecar processes

KEY = b"s" * 32


def _serve(socket: str, resume: int | None, until: int) -> None:
    done, start = 0, resume or 0
    with SidecarLoader(socket, rank=0, world_size=1, microbatch_size=16,
                       resume_step=resume) as loader:
        for batch in loader:
            if batch.lane_digests:  # the last microbatch of a step
                done += 1
                if done == until - start:
                    break
        assert loader.checkpoint()["committed"]


def test_a_keyed_sidecar_resumes_only_signed_checkpoints(
        sidecar: Callable[..., Any], repeat_recipe: str, tmp_path: Path) -> None:
    key = tmp_path / "ledger.key"
    key.write_bytes(KEY + b"\n")
    key.chmod(0o600)
    env = {"DATALANE_LEDGER_KEY_FILE": str(key)}
    store_uri = str(tmp_path / "store")
    flags = ("--store", store_uri, "--ranks-per-pod", "1")
    first = sidecar(repeat_recipe, *flags, env=env)
    _serve(first.socket, None, 3)
    assert first.terminate() == 0
    second = sidecar(repeat_recipe, *flags, env=env)
    _serve(second.socket, 3, 4)  # signed with the key: resumed
    step = Path(store_uri) / "steps" / f"{3:012d}"
    (step / "MANIFEST.sig").write_bytes(
        sign_manifest(b"another key, 16+ bytes", 3, (step / "MANIFEST.json").read_bytes()))
    with pytest.raises(StorageError) as info:
        _serve(second.socket, 3, 4)
    assert (f"checkpoint step 3 in file://{store_uri} will not be restored with ledger key "
            in str(info.value)), info.value
    assert f"{step}/MANIFEST.sig was made with another key" in str(info.value)
    (step / "MANIFEST.sig").unlink()
    with pytest.raises(StorageError, match="the manifest is not signed"):
        _serve(second.socket, 3, 4)
    assert CheckpointStore(store_uri).load(3).step == 3  # without the key: hashes only


def test_a_sidecar_does_not_start_with_a_key_file_others_may_read(
        repeat_recipe: str, tmp_path: Path) -> None:
    key = tmp_path / "ledger.key"
    key.write_bytes(KEY)
    key.chmod(0o644)
    proc = subprocess.run(
        [sys.executable, "-m", "datalane_sidecar", "serve", "--socket", str(tmp_path / "s"),
         "--recipe", repeat_recipe, "--store", str(tmp_path / "store")],
        env={"DATALANE_LEDGER_KEY_FILE": str(key), "PATH": "/usr/bin:/bin",
             "PYTHONPATH": ":".join(sys.path)},
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert (f"the ledger key file {key} has mode 0644: others may read or change it"
            in proc.stderr), proc.stderr
    assert f"chmod 600 {key}" in proc.stderr

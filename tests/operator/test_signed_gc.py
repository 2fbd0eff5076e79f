"""The operator's garbage collection is signed with the run's ledger key.

An audit with a ledger key refuses gc records that are not signed with it, so the operator
takes the key from the checkpoint Secret (``DATALANE_LEDGER_KEY``, where the sidecars find it
too) and signs what it removes; the sidecar gets that key even when the pipeline's data has a
Secret of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline
from datalane_operator.storage import StoreView, ledger_key_of

from datalane.store import CheckpointStore
from tests.store.support import commit_steps

from .builders import dp, pod

KEY = "operator-test-ledger-key-0123456789"


def test_the_operator_signs_its_gc_records_with_the_secret_s_key(tmp_path: Path) -> None:
    uri = str(tmp_path / "store")
    commit_steps(CheckpointStore(uri, ledger_key=KEY.encode()), [10, 20, 30])
    secret = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b",
              "DATALANE_LEDGER_KEY": KEY + "\n"}
    assert ledger_key_of(secret) == KEY.encode()
    assert ledger_key_of({"AWS_ACCESS_KEY_ID": "a"}) is None
    look = StoreView(uri, ledger_key=ledger_key_of(secret)).look(keep=1)
    assert (look.committed, look.deleted) == ([30], [10, 20])
    report = CheckpointStore(uri).audit(key=KEY.encode())
    assert report.ok, report.text()
    assert report.history[1].startswith("history: complete back to the first checkpoint; 2 "
                                        "checkpoints before step 30 were garbage-collected")
    record = json.loads((tmp_path / "store" / "gc" / f"{20:012d}.json").read_text())
    assert set(record["signature"]) == {"key_id", "hmac_sha256"}


def test_the_sidecar_gets_the_checkpoint_secret_s_key_beside_a_data_secret() -> None:
    body = dp(data={"secretRef": {"name": "data-creds"}})
    out = mutate_pod(pod(), load_pipeline(body), "img:1")
    side = next(c for c in out["spec"]["initContainers"] if c["name"] == "datalane-sidecar")
    assert side["envFrom"] == [{"secretRef": {"name": "data-creds"}}]
    env = {e["name"]: e for e in side["env"]}
    assert env["DATALANE_LEDGER_KEY"] == {"name": "DATALANE_LEDGER_KEY", "valueFrom": {
        "secretKeyRef": {"name": "s3-creds", "key": "DATALANE_LEDGER_KEY", "optional": True}}}

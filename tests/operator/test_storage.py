"""Listing and garbage collection through the checkpoint store, on disk and on real S3."""

from __future__ import annotations

from pathlib import Path

from datalane_operator.pipeline import CheckpointSpec, SecretRef
from datalane_operator.storage import (
    StoreView,
    operator_store_options,
    scheme_of,
    sidecar_store_options,
)

from datalane.store import CheckpointStore
from tests.store.support import commit_steps, write_step
from tests.support.s3server import S3Bucket


def test_options() -> None:
    s3 = CheckpointSpec("s3://b/run", SecretRef("creds"), "http://127.0.0.1:9000")
    assert sidecar_store_options(s3) == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    secret = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "OTHER": "x"}
    assert operator_store_options(s3, secret) == {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}, "key": "AK", "secret": "SK"}
    assert operator_store_options(CheckpointSpec("/mnt/c"), secret) == {}
    assert (scheme_of("/mnt/c"), scheme_of("S3://x"), scheme_of("gs://b")) == ("file", "s3", "gs")


def test_list_and_gc_on_disk(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    commit_steps(store, [2, 4, 6, 8])
    write_step(store, 9, skip=(1,))  # in progress: never collected
    view = StoreView(str(tmp_path))
    look = view.look(keep=2, collect=False)
    assert (look.committed, look.deleted, look.ok) == ([2, 4, 6, 8], [], True)
    look = view.look(keep=2)
    assert (look.committed, look.deleted) == ([6, 8], [2, 4])
    assert store.latest_committed(verify=True) == 8
    assert 9 in {int(p.name) for p in (tmp_path / "steps").iterdir()}


def test_list_and_gc_on_s3_with_secret_credentials(s3_bucket: S3Bucket) -> None:
    uri = f"{s3_bucket.uri}/run"
    commit_steps(CheckpointStore(uri, s3_bucket.storage_options), [1, 2, 3])
    spec = CheckpointSpec(uri, SecretRef("creds"), s3_bucket.endpoint, keep=1)
    secret = {"AWS_ACCESS_KEY_ID": s3_bucket.storage_options["key"],
              "AWS_SECRET_ACCESS_KEY": s3_bucket.storage_options["secret"]}
    look = StoreView(uri, operator_store_options(spec, secret)).look(keep=spec.keep)
    assert (look.committed, look.deleted) == ([3], [1, 2])


def test_errors_are_reported_not_raised(s3_bucket: S3Bucket) -> None:
    # a missing prefix is an empty store, an unreachable endpoint is an error
    missing = CheckpointSpec(f"{s3_bucket.uri}/nothing-here", None, s3_bucket.endpoint)
    look = StoreView(missing.uri, operator_store_options(missing, None)).look(keep=1)
    assert look.ok and look.committed == []
    down = CheckpointSpec(f"{s3_bucket.uri}/run", None, "http://127.0.0.1:9")
    options = operator_store_options(down, None)
    options["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 1}
    look = StoreView(down.uri, options, retries=0).look(keep=1)
    assert not look.ok and look.committed == []
    assert "127.0.0.1:9" in look.error

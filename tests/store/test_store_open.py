"""Opening a checkpoint store: the URI it names itself by, a URI it cannot open, its retries.

Local files only; the transient failures come from :class:`tests.store.faults.FaultyFS`
around the local filesystem.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from datalane.spec.errors import ConfigError, StorageError
from datalane.store import CheckpointStore

from .faults import FaultyFS


def test_a_local_path_is_named_by_its_file_uri(tmp_path: Path) -> None:
    store = CheckpointStore(f"{tmp_path}/ckpt/")
    assert store.uri == f"file://{tmp_path}/ckpt"
    assert repr(store) == f"CheckpointStore('file://{tmp_path}/ckpt')"


def test_a_uri_fsspec_cannot_open_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError) as err:
        CheckpointStore("nosuchproto://bucket/run")
    assert str(err.value).startswith("cannot open checkpoint store 'nosuchproto://bucket/run': ")
    assert "nosuchproto" in str(err.value).split(": ", 1)[1]


def test_a_transient_failure_is_tried_four_times_by_default(tmp_path: Path) -> None:
    """``retries`` defaults to 3 (docs/checkpoint-format.md): one attempt and 3 retries."""
    fs = FaultyFS(LocalFileSystem()).always_fail("cat_file", "read_timeout")
    store = CheckpointStore(str(tmp_path / "ckpt"), filesystem=fs, backoff=0.0)
    with pytest.raises(StorageError) as err:
        store.is_committed(10)
    assert err.value.transient
    assert "(transient; gave up after 4 attempts)" in str(err.value)
    assert fs.calls["cat_file"] == 4
    # three failures in a row are ridden out: the 4th read answers (no manifest)
    fs = FaultyFS(LocalFileSystem())
    for nth in (1, 2, 3):
        fs.on("cat_file", nth, "read_timeout")
    store = CheckpointStore(str(tmp_path / "ckpt"), filesystem=fs, backoff=0.0)
    assert store.is_committed(10) is False
    assert fs.calls["cat_file"] == 4

"""Fixtures of the checkpoint-store tests: the same tests run on local paths and on S3."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

from datalane.store import CheckpointStore


@dataclass
class Backend:
    """A store location plus raw access to its objects (to corrupt, truncate, delete)."""

    kind: str
    uri: str
    options: dict[str, Any]

    def __post_init__(self) -> None:
        self.fs, self.base = fsspec.core.url_to_fs(self.uri, **self.options)

    def store(self, **kw: Any) -> CheckpointStore:
        kw.setdefault("backoff", 0.001)
        return CheckpointStore(self.uri, self.options, **kw)

    def path(self, step: int, name: str) -> str:
        return f"{self.base}/steps/{step:012d}/{name}"

    def read(self, step: int, name: str) -> bytes:
        return bytes(self.fs.cat_file(self.path(step, name)))

    def write(self, step: int, name: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(step, name), data)

    def delete(self, step: int, name: str) -> None:
        self.fs.rm(self.path(step, name))

    def names(self, step: int) -> list[str]:
        self.fs.invalidate_cache()
        prefix = f"{self.base}/steps/{step:012d}"
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.find(prefix))


@pytest.fixture
def local(tmp_path: Path) -> Backend:
    return Backend("local", str(tmp_path / "ckpt"), {})


@pytest.fixture
def s3(s3_bucket: Any) -> Backend:
    return Backend("s3", f"{s3_bucket.uri}/runs/job-1", dict(s3_bucket.storage_options))


@pytest.fixture(params=["local", "file-uri", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every test using this runs on a plain path, a ``file://`` URI and S3 (moto)."""
    if request.param == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        return Backend("s3", f"{bucket.uri}/runs/job-1", dict(bucket.storage_options))
    if request.param == "file-uri":
        return Backend("file-uri", f"file://{tmp_path}/ckpt", {})
    return Backend("local", str(tmp_path / "ckpt"), {})

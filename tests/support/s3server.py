"""pytest plugin: a real S3 endpoint on loopback (moto's standalone server in a subprocess).

Registered from ``tests/conftest.py`` (``pytest_plugins = ["tests.support.s3server"]``). Fixtures:

* ``s3_server`` (session): starts ``python -m moto.server`` on a free 127.0.0.1 port - the
  real S3 HTTP protocol through botocore and s3fs, not an in-process patch - sets dummy AWS
  credentials in the environment and yields the endpoint URL.
* ``s3_bucket``: a fresh, empty bucket per test, as :class:`S3Bucket` (``uri`` such as
  ``s3://test-1a2b3c``, ``storage_options`` for fsspec/s3fs, ``endpoint``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["S3Bucket", "s3_bucket", "s3_server"]

ACCESS_KEY = "datalane-test-key"
SECRET_KEY = "datalane-test-secret"
_START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class S3Bucket:
    """A bucket on the test S3 endpoint."""

    uri: str
    storage_options: dict[str, Any]
    endpoint: str
    name: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: str, log: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=2):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the server is up
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto server did not answer on {endpoint} within {_START_TIMEOUT_S}s:\n"
                       f"{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Endpoint URL of a moto S3 server running as a separate process on loopback."""
    env_vars = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env_vars.items():
            mp.setenv(k, v)
        for k in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
            mp.delenv(k, raising=False)
        last: Exception | None = None
        for _ in range(3):  # a port taken between probe and bind: try another
            port = _free_port()
            endpoint = f"http://127.0.0.1:{port}"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                    stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
            try:
                _wait_ready(proc, endpoint, log)
            except RuntimeError as e:
                last = e
                proc.kill()
                proc.wait()
                continue
            try:
                yield endpoint
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            return
        raise RuntimeError(f"could not start the moto server: {last}")


@pytest.fixture
def s3_bucket(s3_server: str) -> S3Bucket:
    """A fresh bucket on the moto server, with fsspec storage options to reach it."""
    import s3fs

    name = f"test-{uuid.uuid4().hex[:12]}"
    options: dict[str, Any] = {
        "client_kwargs": {"endpoint_url": s3_server},
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
    }
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir(name)
    return S3Bucket(f"s3://{name}", options, s3_server, name)

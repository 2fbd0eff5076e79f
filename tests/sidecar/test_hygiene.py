"""Security hygiene of a real sidecar process: the metrics port listens on loopback unless
told otherwise, no credential reaches its logs even at DEBUG (S3 on moto), and a file at the
socket path that is not a socket is refused, never deleted."""

from __future__ import annotations

import json
import logging
import os
import socket as socketlib
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from datalane_sidecar.logs import JsonFormatter, Redactor, credentials_in

from datalane.client import SidecarLoader
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, S3Bucket

pytestmark = pytest.mark.slow  # real sidecar processes


def _free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} shows them) in LISTEN state on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, _remote, state = line.split()[1:4]
            addr, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:
                out.append(addr)
    return out


def test_metrics_listen_on_loopback_unless_an_address_is_given(sidecar, repeat_recipe) -> None:
    port = _free_port()
    sc = sidecar(repeat_recipe, "--metrics-port", str(port))
    assert _listening(port) == ["0100007F"], "metrics must not listen on every interface"
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        next(iter(loader))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "datalane_tokens_total" in text


def _serve(socket: str, recipe: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datalane_sidecar", "serve", "--socket", socket,
                           "--recipe", recipe], capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_file_at_the_socket_path_is_refused_not_deleted(tmp_path: Path, repeat_recipe,
                                                          sidecar) -> None:
    path = tmp_path / "dl.sock"
    path.write_text("precious")
    out = _serve(str(path), repeat_recipe)
    assert out.returncode == 2, out.stderr
    assert (f"datalane-sidecar serve: error: socket path {path} exists and is a regular file, "
            f"not a socket; the sidecar deletes only a stale socket of its own: remove it or "
            f"pass another --socket") in out.stderr
    assert path.read_text() == "precious"
    # a symbolic link is not followed, nor removed
    link = tmp_path / "link.sock"
    link.symlink_to(path)
    out = _serve(str(link), repeat_recipe)
    assert out.returncode == 2 and "exists and is a symbolic link, not a socket" in out.stderr
    assert link.is_symlink() and path.read_text() == "precious"
    # a stale socket of a previous run (nothing listening on it) is replaced
    stale = tmp_path / "stale" / "dl.sock"
    stale.parent.mkdir()
    with socketlib.socket(socketlib.AF_UNIX) as s:
        s.bind(str(stale))
    sc = sidecar(repeat_recipe, socket=str(stale))
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        assert next(iter(loader)).step == 0


def test_no_credential_in_the_logs_at_debug(sidecar, repeat_recipe, s3_bucket: S3Bucket,
                                            ) -> None:
    """Checkpoints to S3 (moto) with the sidecar at --log-level debug: the key id and secret,
    given both in the environment and in --store-options, appear nowhere in its log."""
    options = dict(s3_bucket.storage_options)
    sc = sidecar(repeat_recipe, "--store", f"{s3_bucket.uri}/run", "--store-options",
                 json.dumps(options), "--ranks-per-pod", "1", "--log-level", "debug",
                 env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        for _ in range(8):
            next(iter(loader))
        assert loader.checkpoint()["committed"]
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4,
                       resume_step=2) as loader:
        assert next(iter(loader)).step == 2
    assert sc.terminate() == 0
    log = sc.log.read_text()
    assert '"msg": "serving"' in log
    for secret in (ACCESS_KEY, SECRET_KEY):
        assert secret not in log, f"{secret!r} is in the sidecar's log"
    for line in log.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            assert not record["logger"].startswith(("botocore", "s3fs", "aiobotocore")) or (
                record["level"] != "debug"), line


def test_the_formatter_redacts_values_and_shapes() -> None:
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    redact = Redactor([secret, "abc", *credentials_in({"client_kwargs": {"x": 1},
                                                        "token": "session-token-value"})])
    fmt = JsonFormatter(redact)
    header = ("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/s3/"
              "aws4_request, SignedHeaders=host, Signature=" + "ab" * 32)
    record = logging.makeLogRecord({
        "name": "botocore.endpoint", "levelno": logging.DEBUG, "levelname": "DEBUG",
        "msg": "Sending %s with secret %s", "args": (header, secret),
        "headers": {"X-Amz-Security-Token": b"session-token-value", "Authorization": header}})
    line = fmt.format(record)
    for leaked in ("AKIAIOSFODNN7EXAMPLE", secret, "session-token-value", "ab" * 32):
        assert leaked not in line, line
    assert "Credential=<redacted>/20260101" in line and "Signature=<redacted>" in line
    assert "abc" not in redact._values  # too short to be a credential: never redacted
    assert json.loads(line)["level"] == "debug"
    # the X-Amz-Security-Token of a presigned URL or header dump is redacted by its shape too
    assert Redactor()("?X-Amz-Security-Token=FQoGZXIvYXdzEXAMPLE&x=1") == (
        "?X-Amz-Security-Token=<redacted>&x=1")

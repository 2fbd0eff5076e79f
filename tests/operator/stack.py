"""The datalane stack on the test control plane: the Helm chart, installed with ``helm``, and
``datalane-operator run`` as a local process that the chart's webhooks reach over loopback.

The operator authenticates with a token of the chart's ServiceAccount, so it runs with
exactly the chart's RBAC: a missing permission fails the test that needs it.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from datalane_operator.certs import make_bundle

from tests.cluster.harness import Cluster, free_ports

from .helmchart import CHART

SIDECAR_IMAGE = "datalane-sidecar:e2e"


@dataclass
class Stack:
    cluster: Cluster
    namespace: str
    release: str
    webhook_port: int
    liveness: str
    log: Path
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def fullname(self) -> str:
        return f"{self.release}-datalane"

    def start(self) -> None:
        setpriv = shutil.which("setpriv")
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                ([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []) + self.argv,
                env=self.env, stdout=f, stderr=subprocess.STDOUT)
        _wait_https(self.webhook_port, time.monotonic() + 60, self.proc, self.log)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def probes(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.liveness, timeout=5) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator is not running:\n{self.log_tail()}")


def _sa_kubeconfig(cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=2h").stdout
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": base64.b64encode(cluster.ca_pem).decode()}}],
        "users": [{"name": sa, "user": {"token": token.strip()}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": sa}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _wait_https(port: int, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the operator exited:\n{log.read_text()[-4000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s, \
                    ctx.wrap_socket(s):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the operator's webhook server is not up:\n{log.read_text()[-4000:]}")


@contextmanager
def datalane_stack(cluster: Cluster, namespace: str, workdir: Path,
                   storage_interval: float = 1.0) -> Iterator[Stack]:
    release = "dl"
    webhook_port, liveness_port = free_ports(2)
    tls = make_bundle(["127.0.0.1", "localhost"])
    tls_dir = workdir / "tls"
    tls.write(tls_dir)
    values = {
        "operator": {"enabled": False},
        "tls": {"mode": "secret"},
        "webhook": {"url": f"https://127.0.0.1:{webhook_port}",
                    "caBundle": base64.b64encode(tls.ca_pem).decode(),
                    "timeoutSeconds": 10,
                    # only this test's namespace: other tests share the control plane
                    "namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": namespace}}},
        "sidecar": {"image": SIDECAR_IMAGE},
        # the tests' file:// stores (under workdir) are the operator's own disk: an opt-in
        "checkpoints": {"allowOperatorIdentity": True,
                        "operatorIdentityPrefixes": {namespace: [f"file://{workdir}/"]}},
    }
    (workdir / "values.yaml").write_text(yaml.safe_dump(values))
    cluster.helm("install", release, str(CHART), "--namespace", namespace, "--values",
                 str(workdir / "values.yaml"), "--wait", "--timeout", "120s")
    log = workdir / "operator.log"
    kubeconfig = _sa_kubeconfig(cluster, namespace, f"{release}-datalane",
                                workdir / "operator.kubeconfig")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "HOME": str(workdir), "LANG": "C.UTF-8", "KUBECONFIG": str(kubeconfig)}
    exe = str(Path(sys.executable).parent / "datalane-operator")
    argv = [exe, "run", "--tls-dir", str(tls_dir), "--webhook-addr", "127.0.0.1",
            "--webhook-port", str(webhook_port), "--webhook-configuration",
            f"{release}-datalane", "--liveness", f"http://127.0.0.1:{liveness_port}/healthz",
            "--storage-interval", str(storage_interval), "--log-format", "full",
            # what the chart's Deployment passes from the values sidecar.image, checkpoints.*
            "--sidecar-image", SIDECAR_IMAGE, "--allow-operator-identity",
            "--operator-identity-prefixes",
            json.dumps(values["checkpoints"]["operatorIdentityPrefixes"])]
    stack = Stack(cluster, namespace, release, webhook_port,
                  f"http://127.0.0.1:{liveness_port}/healthz", log, argv, env)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        cluster.helm("uninstall", release, "--namespace", namespace, "--wait", check=False)

"""The datalane stack on the test control plane: the Helm chart, installed with ``helm``, and
``datalane-operator run`` as local processes that the chart's webhooks reach over loopback.

The operator authenticates with a token of the chart's ServiceAccount, so it runs with
exactly the chart's RBAC: a missing permission fails the test that needs it. The stack's
namespace carries the opt-in label ``datalane.io/inject=enabled``, as a user's would.

``replicas=1`` (the default) is one operator without leader election, the webhook URL at its
port. ``replicas=2`` runs two, electing a leader through the chart's Lease as the Deployment
does, behind a :class:`~tests.operator.spread.Spreader` that plays the Service.
"""

from __future__ import annotations

import base64
import contextlib
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
from datalane_operator import names
from datalane_operator.certs import make_bundle

from tests.cluster.harness import Cluster, free_ports

from .helmchart import CHART, ROOT
from .spread import Spreader

SIDECAR_IMAGE = "datalane-sidecar:e2e"


@dataclass
class Replica:
    """One ``datalane-operator run`` process."""

    identity: str
    webhook_port: int
    liveness: str
    log: Path
    argv: list[str]
    env: dict[str, str]
    metrics_url: str = ""  # its Prometheus metrics (--metrics)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        setpriv = shutil.which("setpriv")
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                ([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []) + self.argv,
                env=self.env, stdout=f, stderr=subprocess.STDOUT)
        _wait_https(self.webhook_port, time.monotonic() + 60, self.proc, self.log)

    def stop(self) -> None:
        """SIGTERM (what a pod's deletion sends): the operator stops cleanly."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL (a node lost, an OOM kill): nothing is released."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def probes(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.liveness, timeout=5) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of its /metrics, by (name, sorted labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator is not running:\n{self.log_tail()}")


@dataclass
class Stack:
    cluster: Cluster
    namespace: str
    release: str
    replicas: list[Replica]
    lease: str | None = None  # the Lease of leader election (replicas > 1)
    spreader: Spreader | None = None

    @property
    def fullname(self) -> str:
        return f"{self.release}-datalane"

    # the first replica: the whole operator of a one-replica stack
    @property
    def log(self) -> Path:
        return self.replicas[0].log

    @property
    def webhook_port(self) -> int:
        return self.replicas[0].webhook_port

    @property
    def liveness(self) -> str:
        return self.replicas[0].liveness

    def start(self) -> None:
        for r in self.replicas:
            if not r.alive:
                r.start()

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    def probes(self) -> dict[str, Any]:
        return self.replicas[0].probes()

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return self.replicas[0].metrics()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(f"--- {r.identity}\n{r.log_tail(lines)}" for r in self.replicas)

    def check_alive(self) -> None:
        for r in self.replicas:
            r.check_alive()


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
                   storage_interval: float = 1.0, replicas: int = 1, release: str = "dl",
                   only_this_namespace: bool = True,
                   lease_timings: tuple[float, float, float] = (6.0, 4.0, 0.5),
                   recipe_grace: float = 2.0) -> Iterator[Stack]:
    """The chart and ``replicas`` operators. ``only_this_namespace``: the webhooks see only
    ``namespace`` (other tests share the control plane); False leaves the opt-in label as
    the only scope, as in a real install. ``lease_timings``: lease duration, renew deadline
    and retry period of leader election (shorter than the chart's, for quick tests);
    ``recipe_grace``: how long an old recipe ConfigMap stays unmounted before it goes."""
    ports = free_ports(1 + 3 * replicas)
    front, ports = ports[0], ports[1:]
    webhook_ports, liveness_ports = ports[:replicas], ports[replicas:2 * replicas]
    metrics_ports = ports[2 * replicas:]
    url_port = webhook_ports[0] if replicas == 1 else front
    tls = make_bundle(["127.0.0.1", "localhost"])
    tls_dir = workdir / "tls"
    tls.write(tls_dir)
    cluster.kubectl("label", "namespace", namespace, "--overwrite",
                    f"{names.NAMESPACE_OPT_IN_LABEL}={names.NAMESPACE_OPT_IN_VALUE}")
    values: dict[str, Any] = {
        "operator": {"enabled": False, "optedInNamespaces": [namespace]},
        "tls": {"mode": "secret"},
        "webhook": {"url": f"https://127.0.0.1:{url_port}",
                    "caBundle": base64.b64encode(tls.ca_pem).decode()},
        "sidecar": {"image": SIDECAR_IMAGE},
        # the tests' file:// stores (under workdir) are the operator's own disk: an opt-in
        "checkpoints": {"allowOperatorIdentity": True,
                        "operatorIdentityPrefixes": {namespace: [f"file://{workdir}/"]}},
    }
    if only_this_namespace:
        values["webhook"]["namespaceSelector"] = {"matchLabels": {
            "kubernetes.io/metadata.name": namespace}}
    (workdir / "values.yaml").write_text(yaml.safe_dump(values))
    # --take-ownership: the CRD may be another's (an earlier stack's release kept it, or
    # tests/operator/test_crd_cluster.py applied it), as docs/operator.md#upgrades says
    cluster.helm("install", release, str(CHART), "--namespace", namespace, "--values",
                 str(workdir / "values.yaml"), "--take-ownership", "--wait", "--timeout", "120s")
    kubeconfig = _sa_kubeconfig(cluster, namespace, f"{release}-datalane",
                                workdir / "operator.kubeconfig")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "HOME": str(workdir), "LANG": "C.UTF-8", "KUBECONFIG": str(kubeconfig),
           # the operator of this checkout, not the one the virtualenv was installed from
           "PYTHONPATH": f"{ROOT}:{ROOT / 'sidecar'}:{ROOT / 'operator'}"}
    exe = str(Path(sys.executable).parent / "datalane-operator")
    lease = f"{release}-datalane-leader" if replicas > 1 else None
    members = []
    for i in range(replicas):
        argv = [exe, "run", "--tls-dir", str(tls_dir), "--webhook-addr", "127.0.0.1",
                "--webhook-port", str(webhook_ports[i]), "--webhook-configuration",
                f"{release}-datalane", "--liveness",
                f"http://127.0.0.1:{liveness_ports[i]}/healthz",
                "--metrics", f"http://127.0.0.1:{metrics_ports[i]}/metrics",
                "--storage-interval", str(storage_interval), "--log-format", "full",
                "--recipe-grace", str(recipe_grace),
                # what the chart's Deployment passes from sidecar.image, checkpoints.*
                "--sidecar-image", SIDECAR_IMAGE, "--allow-operator-identity",
                "--operator-identity-prefixes",
                json.dumps(values["checkpoints"]["operatorIdentityPrefixes"])]
        if lease is not None:  # as the Deployment: the chart's Lease in its namespace
            duration, deadline, retry = lease_timings
            argv += ["--leader-election-lease", lease, "--leader-election-namespace",
                     namespace, "--leader-election-identity", f"replica-{i}",
                     "--lease-duration", str(duration), "--renew-deadline", str(deadline),
                     "--retry-period", str(retry)]
        log = workdir / ("operator.log" if replicas == 1 else f"operator-{i}.log")
        members.append(Replica(f"replica-{i}", webhook_ports[i],
                               f"http://127.0.0.1:{liveness_ports[i]}/healthz", log, argv,
                               env, f"http://127.0.0.1:{metrics_ports[i]}/metrics"))
    spreader = Spreader(front, webhook_ports) if replicas > 1 else None
    stack = Stack(cluster, namespace, release, members, lease, spreader)
    try:
        with spreader or contextlib.nullcontext():
            stack.start()
            yield stack
    finally:
        stack.stop()
        cluster.helm("uninstall", release, "--namespace", namespace, "--wait", check=False)

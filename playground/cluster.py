"""A real Kubernetes control plane for tests, run as local processes on loopback.

etcd and kube-apiserver (plus kube-controller-manager, kube-scheduler, kwok with fake GPU
nodes and, on demand, Kubeflow's training-operator) are started the way controller-runtime's
envtest starts them: free loopback ports, generated certificates, a service-account key,
RBAC authorization. The binaries come from tests/cluster/build.sh (built from Go modules,
cached outside the clone). Nothing here mocks the API server.

Used by the pytest fixtures in tests/cluster/plugin.py and by the playground
(playground/__main__.py, docs/playground.md); usable alone too:

    from playground.cluster import Cluster
    with Cluster() as c:
        print(c.kubeconfig)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .certs import CertAuthority, KeyPair, service_account_key

ROOT = Path(__file__).resolve().parents[1]
BUILD_SH = ROOT / "tests" / "cluster" / "build.sh"  # a build script, run (not imported)

SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"

BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
    "training-operator.v1",
)

# kwok manages only nodes carrying this annotation.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"

# training-operator v1.9 (run out of cluster): its cert rotator keeps the CA in this Secret
# and injects it into a ValidatingWebhookConfiguration of this name. We register the
# operator's real validating webhook under another name, served with our own certificate
# on loopback, so the rotator leaves it alone (it only logs that its own one is absent).
TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR_SECRET = "training-operator-webhook-cert"
TRAINING_OPERATOR_WEBHOOK = "datalane-test-training-operator"


def _say(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


class ClusterError(RuntimeError):
    """The control plane failed to build, start or become ready."""


# ----------------------------------------------------------------------------- binaries


def cache_bin_dir() -> Path:
    """Where build.sh puts (or put) the binaries for the pinned versions."""
    if os.environ.get("DATALANE_CLUSTER_BIN"):
        return Path(os.environ["DATALANE_CLUSTER_BIN"])
    out = subprocess.run(
        ["bash", str(BUILD_SH), "--print-bin-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def missing_binaries(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def ensure_binaries(log: Callable[[str], None] | None = None) -> Path:
    """Return the bin dir, running build.sh first if any binary is missing.

    build.sh's progress goes to stdout/stderr of this process (the pytest plugin suspends
    output capture around this call so a first build shows its progress).
    """
    bin_dir = cache_bin_dir()
    missing = missing_binaries(bin_dir)
    if not missing:
        return bin_dir
    if "DATALANE_CLUSTER_BIN" in os.environ:
        raise ClusterError(f"DATALANE_CLUSTER_BIN={bin_dir} lacks {missing}")
    if log:
        log(
            f"control plane binaries missing ({', '.join(missing)}): running {BUILD_SH} "
            "(a first build takes tens of minutes on 2 cores; later runs use the cache)"
        )
    t0 = time.monotonic()
    rc = subprocess.run(["bash", str(BUILD_SH)], check=False).returncode
    if rc != 0:
        raise ClusterError(f"{BUILD_SH} failed with exit code {rc} (its output says which step)")
    if log:
        log(f"build.sh finished in {time.monotonic() - t0:.0f}s")
    still = missing_binaries(bin_dir)
    if still:
        raise ClusterError(f"{BUILD_SH} succeeded but {bin_dir} still lacks {still}")
    return bin_dir


def share_dir(bin_dir: Path) -> Path:
    return bin_dir.parent / "share"


# ----------------------------------------------------------------------------- processes


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _with_parent_death_signal(args: list[str]) -> list[str]:
    """Prefix args so the child gets SIGKILL if the test process dies (even by SIGKILL).

    util-linux's setpriv sets PR_SET_PDEATHSIG and execs; without it the child simply
    outlives a killed test run (stop() and the atexit hook still end it on a normal exit).
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *args] if setpriv else args


@dataclass
class Process:
    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = self.log_path.open("ab")
        logf.write(f"$ {' '.join(self.args)}\n".encode())
        logf.flush()
        try:
            self.popen = subprocess.Popen(
                _with_parent_death_signal(self.args),
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # Ctrl-C in the terminal does not reach it first
            )
        finally:
            logf.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


# ----------------------------------------------------------------------------- options


@dataclass
class GpuNode:
    name: str
    gpus: int = 8
    cpu: str = "32"
    memory: str = "256Gi"
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ClusterOptions:
    controller_manager: bool = True
    scheduler: bool = True
    kwok: bool = True
    nodes: Sequence[GpuNode] = field(
        default_factory=lambda: [GpuNode(f"kwok-gpu-{i}") for i in range(3)]
    )
    start_timeout: float = 180.0
    verbosity: int = 1
    # Keep the work dir (certs, kubeconfig, logs, etcd data) after stop().
    keep_workdir: bool = False
    # The work dir (must not exist or be empty); default: a fresh temporary folder.
    workdir: Path | None = None
    # Where kube-apiserver listens, and further IPs of its serving certificate: the
    # playground's containers reach it from their own network namespaces (docs/playground.md).
    bind_address: str = "127.0.0.1"
    extra_ips: Sequence[str] = ()
    # --enable-aggregator-routing: webhooks (and aggregated APIs) behind a Service are called at
    # an endpoint of the Service (a pod IP) instead of its ClusterIP, as there is no kube-proxy.
    aggregator_routing: bool = False


# ----------------------------------------------------------------------------- cluster


class Cluster:
    """etcd + kube-apiserver (+ controller-manager, scheduler, kwok, training-operator)."""

    def __init__(self, options: ClusterOptions | None = None, bin_dir: Path | None = None):
        self.options = options or ClusterOptions()
        self._bin_dir = bin_dir
        self.workdir: Path | None = None
        self.processes: dict[str, Process] = {}
        self.ca: CertAuthority | None = None
        self.host = "127.0.0.1"
        self.apiserver_port = 0
        self.etcd_port = 0
        self.training_operator_webhook_port = 0
        self._started = False
        self._ssl: ssl.SSLContext | None = None

    # -- paths --------------------------------------------------------------------------
    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = ensure_binaries(log=lambda m: _say(f"[cluster] {m}"))
        return self._bin_dir

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    @property
    def wd(self) -> Path:
        assert self.workdir is not None, "cluster not started"
        return self.workdir

    @property
    def kubeconfig(self) -> Path:
        return self.wd / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.host}:{self.apiserver_port}"

    @property
    def ca_pem(self) -> bytes:
        assert self.ca is not None
        return self.ca.cert_pem

    @property
    def logs_dir(self) -> Path:
        return self.wd / "logs"

    @property
    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/operators: KUBECONFIG, PATH, private HELM_* dirs."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        for var, sub in (
            ("HELM_CACHE_HOME", "helm/cache"),
            ("HELM_CONFIG_HOME", "helm/config"),
            ("HELM_DATA_HOME", "helm/data"),
        ):
            env[var] = str(self.wd / sub)
        return env

    # -- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(keep_workdir=self.options.keep_workdir or exc[0] is not None)

    def start(self) -> None:
        if self._started:
            return
        t0 = time.monotonic()
        bin_dir = self.bin_dir  # may build
        if self.options.workdir is not None:
            self.options.workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = self.options.workdir
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="datalane-cluster-"))
        atexit.register(self._atexit)
        try:
            self._write_certs()
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfigs()
            if self.options.controller_manager:
                self._start_controller_manager()
            if self.options.scheduler:
                self._start_scheduler()
            if self.options.kwok:
                self._start_kwok()
            self._wait_cluster_ready()
        except BaseException as e:
            report = self.diagnostics()
            self.stop(keep_workdir=True)
            if isinstance(e, ClusterError):
                raise ClusterError(f"{e}\n{report}") from e
            raise
        self._started = True
        self.start_seconds = time.monotonic() - t0
        _say(
            f"[cluster] ready in {self.start_seconds:.1f}s: {self.server} "
            f"kubeconfig={self.kubeconfig} bin={bin_dir}"
        )

    def stop(self, keep_workdir: bool | None = None) -> None:
        for name in reversed(list(self.processes)):
            self.processes[name].stop()
        keep = self.options.keep_workdir if keep_workdir is None else keep_workdir
        if self.workdir is not None and self.workdir.exists():
            if keep or os.environ.get("DATALANE_CLUSTER_KEEP"):
                _say(f"[cluster] kept work dir {self.workdir}")
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
        self._started = False

    def _atexit(self) -> None:
        for p in self.processes.values():
            with contextlib.suppress(Exception):
                p.stop(timeout=5)

    # -- diagnostics --------------------------------------------------------------------
    def diagnostics(self, lines: int = 40) -> str:
        out = [f"cluster work dir: {self.workdir}"]
        for name, p in self.processes.items():
            state = "running" if p.alive() else f"exited rc={p.popen and p.popen.returncode}"
            out.append(f"----- {name} ({state}) log {p.log_path}, last {lines} lines -----")
            out.append(p.tail(lines))
        return "\n".join(out)

    def check_alive(self) -> None:
        dead = [n for n, p in self.processes.items() if not p.alive()]
        if dead:
            raise ClusterError(f"control plane process(es) exited: {', '.join(dead)}")

    # -- certificates -------------------------------------------------------------------
    def _write_certs(self) -> None:
        pki = self.wd / "pki"
        pki.mkdir()
        self.ca = CertAuthority("datalane-test-ca")
        (pki / "ca.crt").write_bytes(self.ca.cert_pem)
        (pki / "ca.key").write_bytes(self.ca.key_pem)
        (pki / "ca.key").chmod(0o600)
        self.ca.issue(
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=["127.0.0.1", KUBERNETES_SERVICE_IP, *self.options.extra_ips],
        ).write(pki / "apiserver.crt", pki / "apiserver.key")
        self.ca.issue(
            "datalane-test-admin", organizations=["system:masters"], server=False, client=True
        ).write(pki / "admin.crt", pki / "admin.key")
        service_account_key().write(pki / "sa.pub", pki / "sa.key")
        # front proxy (aggregation layer), as kubeadm sets it up
        self.ca.issue("front-proxy-client", server=False, client=True).write(
            pki / "front-proxy-client.crt", pki / "front-proxy-client.key"
        )

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            pki = self.wd / "pki"
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
            self._ssl = ctx
        return self._ssl

    # -- waiting ------------------------------------------------------------------------
    def wait_for(
        self,
        what: str,
        predicate: Callable[[], bool],
        timeout: float | None = None,
        interval: float = 0.25,
    ) -> None:
        deadline = time.monotonic() + (timeout or self.options.start_timeout)
        last_err: BaseException | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if predicate():
                    return
            except Exception as e:
                last_err = e
            time.sleep(interval)
        raise ClusterError(
            f"timed out waiting for {what}" + (f": {last_err!r}" if last_err else "")
        )

    @staticmethod
    def _http_ok(url: str, context: ssl.SSLContext | None = None, expect: bytes = b"ok") -> bool:
        try:
            with urllib.request.urlopen(url, timeout=3, context=context) as r:
                body: bytes = r.read()
                return r.status == 200 and expect in body
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False

    @staticmethod
    def _insecure() -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    # -- etcd ---------------------------------------------------------------------------
    def _start_etcd(self) -> None:
        client, peer = free_ports(2)
        self.etcd_port = client
        data = self.wd / "etcd"
        args = [
            self.bin("etcd"),
            "--name=default",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # a test cluster: speed over durability
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ]
        self._spawn("etcd", args)
        self.wait_for(
            "etcd /health",
            lambda: self._http_ok(f"http://127.0.0.1:{client}/health", expect=b'"health":"true"'),
        )

    # -- kube-apiserver -----------------------------------------------------------------
    def _start_apiserver(self) -> None:
        (self.apiserver_port,) = free_ports(1)
        pki = self.wd / "pki"
        disabled = [] if self.options.controller_manager else ["ServiceAccount"]
        args = [
            self.bin("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.options.bind_address}",
            "--advertise-address=127.0.0.1",
            # 1.37 refuses a loopback address in the kubernetes Service's endpoints.
            "--endpoint-reconciler-type=none",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.wd / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            "--profiling=false",
            f"--v={self.options.verbosity}",
        ]
        if disabled:
            args.append(f"--disable-admission-plugins={','.join(disabled)}")
        if self.options.aggregator_routing:
            args.append("--enable-aggregator-routing=true")
        self._spawn("kube-apiserver", args)
        self.wait_for(
            "kube-apiserver /readyz",
            lambda: self._http_ok(f"{self.server}/readyz", self.ssl_context()),
        )

    # -- kubeconfig ---------------------------------------------------------------------
    def kubeconfig_dict(self) -> dict[str, Any]:
        import base64

        pki = self.wd / "pki"

        def b64(p: str) -> str:
            return base64.b64encode((pki / p).read_bytes()).decode()

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "datalane-test",
                    "cluster": {"server": self.server, "certificate-authority-data": b64("ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": b64("admin.crt"),
                        "client-key-data": b64("admin.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "datalane-test", "context": {"cluster": "datalane-test", "user": "admin"}}
            ],
            "current-context": "datalane-test",
        }

    def _write_kubeconfigs(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_dict(), sort_keys=False))
        self.kubeconfig.chmod(0o600)
        for d in ("helm/cache", "helm/config", "helm/data"):
            (self.wd / d).mkdir(parents=True, exist_ok=True)

    # -- controller-manager, scheduler --------------------------------------------------
    def _component_common(self, name: str, port: int) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.wd / (name + '-certs')}",
            f"--v={self.options.verbosity}",
        ]

    def _start_controller_manager(self) -> None:
        (port,) = free_ports(1)
        pki = self.wd / "pki"
        args = [
            self.bin("kube-controller-manager"),
            *self._component_common("kube-controller-manager", port),
            "--controllers=*",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--use-service-account-credentials=false",
            "--cluster-name=datalane-test",
        ]
        self._spawn("kube-controller-manager", args)
        self.wait_for(
            "kube-controller-manager /healthz",
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", self._insecure()),
        )

    def _start_scheduler(self) -> None:
        (port,) = free_ports(1)
        args = [self.bin("kube-scheduler"), *self._component_common("kube-scheduler", port)]
        self._spawn("kube-scheduler", args)
        self.wait_for(
            "kube-scheduler /healthz",
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", self._insecure()),
        )

    # -- kwok ---------------------------------------------------------------------------
    def _start_kwok(self) -> None:
        stages = share_dir(self.bin_dir) / "kwok-stages.yaml"
        if not stages.is_file():
            raise ClusterError(f"kwok stages missing: {stages} (rerun {BUILD_SH})")
        (port,) = free_ports(1)
        key, value = KWOK_NODE_ANNOTATION
        args = [
            self.bin("kwok"),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--node-lease-duration-seconds=40",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.1.0.1",
            f"--server-address=127.0.0.1:{port}",
        ]
        self._spawn("kwok", args)
        self.wait_for("kwok /healthz", lambda: self._http_ok(f"http://127.0.0.1:{port}/healthz"))
        for node in self.options.nodes:
            self.create_fake_node(node)

    def create_fake_node(self, node: GpuNode) -> None:
        key, value = KWOK_NODE_ANNOTATION
        capacity = {
            "cpu": node.cpu,
            "memory": node.memory,
            "pods": "110",
            "ephemeral-storage": "1Ti",
            GPU_RESOURCE: str(node.gpus),
        }
        manifest = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nvidia.com/gpu.present": "true",
                    **node.labels,
                },
            },
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        self.kubectl_apply(manifest)

    # -- readiness ----------------------------------------------------------------------
    def _wait_cluster_ready(self) -> None:
        if self.options.controller_manager:
            # The service-account controller populates every namespace; pods need it.
            self.wait_for(
                "serviceaccount default/default",
                lambda: (
                    self.kubectl(
                        "get", "serviceaccount", "default", "-n", "default", check=False
                    ).returncode
                    == 0
                ),
                interval=0.5,
            )
        if self.options.kwok and self.options.nodes:
            names = [n.name for n in self.options.nodes]
            self.wait_for(
                f"fake nodes Ready: {names}", lambda: self._nodes_ready(names), interval=0.5
            )

    def _nodes_ready(self, names: Sequence[str]) -> bool:
        out = self.kubectl("get", "nodes", "-o", "json", check=False)
        if out.returncode != 0:
            return False
        ready = set()
        for item in json.loads(out.stdout)["items"]:
            for cond in item.get("status", {}).get("conditions", []):
                if cond["type"] == "Ready" and cond["status"] == "True":
                    ready.add(item["metadata"]["name"])
        return set(names) <= ready

    # -- training-operator (Kubeflow, PyTorchJob) ----------------------------------------
    def start_training_operator(self) -> None:
        """Run Kubeflow training-operator v1.9 (PyTorchJob only) against this cluster.

        Applies its PyTorchJob CRD, starts it out of cluster with the admin kubeconfig, and
        registers its validating webhook on loopback with a certificate from our CA.
        """
        if "training-operator" in self.processes:
            return
        crd = share_dir(self.bin_dir) / "training-operator" / "kubeflow.org_pytorchjobs.yaml"
        if not crd.is_file():
            raise ClusterError(f"PyTorchJob CRD missing: {crd} (rerun {BUILD_SH})")
        # The CRD is ~600 KB: too large for client-side apply's annotation.
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.wait_crd_established("pytorchjobs.kubeflow.org")
        ns = TRAINING_OPERATOR_NAMESPACE
        self.kubectl_apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self.kubectl_apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": TRAINING_OPERATOR_SECRET, "namespace": ns},
                "type": "Opaque",
            }
        )
        # Serving certificate the way the Deployment would mount it: controller-runtime reads
        # $TMPDIR/k8s-webhook-server/serving-certs, the rotator checks that /tmp path exists.
        assert self.ca is not None
        pair = self.ca.issue(
            "training-operator",
            dns_names=[f"training-operator.{ns}.svc", "localhost"],
            ip_addresses=["127.0.0.1"],
        )
        tmpdir = self.wd / "training-operator-tmp"
        for d in (
            tmpdir / "k8s-webhook-server/serving-certs",
            Path("/tmp/k8s-webhook-server/serving-certs"),
        ):
            d.mkdir(parents=True, exist_ok=True)
            if d.is_relative_to(self.wd) or not (d / "tls.crt").exists():
                pair.write(d / "tls.crt", d / "tls.key")
        webhook_port, metrics_port, probe_port = free_ports(3)
        self.training_operator_webhook_port = webhook_port
        env = dict(self.env)
        env["MY_POD_NAMESPACE"] = ns
        env["TMPDIR"] = str(tmpdir)
        args = [
            self.bin("training-operator.v1"),
            f"--kubeconfig={self.kubeconfig}",
            "--enable-scheme=pytorchjob",
            f"--webhook-server-port={webhook_port}",
            f"--metrics-bind-address=127.0.0.1:{metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--leader-elect=false",
            "--zap-log-level=info",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ]
        self._spawn("training-operator", args, env=env)
        self.wait_for(
            "training-operator /readyz",
            lambda: self._http_ok(f"http://127.0.0.1:{probe_port}/readyz"),
            timeout=120,
        )
        self.kubectl_apply(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": TRAINING_OPERATOR_WEBHOOK},
                "webhooks": [
                    {
                        "name": "validator.pytorchjob.training-operator.kubeflow.org",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{webhook_port}"
                            "/validate-kubeflow-org-v1-pytorchjob",
                            "caBundle": _b64(self.ca.cert_pem),
                        },
                        "rules": [
                            {
                                "apiGroups": ["kubeflow.org"],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["pytorchjobs"],
                            }
                        ],
                    }
                ],
            }
        )

    # -- helpers ------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        p = Process(name, args, self.wd / "logs" / f"{name}.log", env=env)
        self.processes[name] = p
        p.start()
        return p

    def run_tool(
        self,
        tool: str,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.bin(tool), *args]
        out = subprocess.run(
            cmd,
            env=self.env,
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise ClusterError(
                f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
            )
        return out

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run_tool("kubectl", f"--kubeconfig={self.kubeconfig}", *args, **kw)

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run_tool("helm", f"--kubeconfig={self.kubeconfig}", *args, **kw)

    def kubectl_apply(self, *objs: dict[str, Any]) -> None:
        docs = yaml.safe_dump_all(list(objs), sort_keys=False)
        self.kubectl("apply", "-f", "-", input=docs)

    def wait_crd_established(self, name: str, timeout: float = 60) -> None:
        # (kubectl wait fails outright while .status.conditions is still empty)
        def established() -> bool:
            out = self.kubectl(
                "get",
                f"crd/{name}",
                "-o",
                'jsonpath={.status.conditions[?(@.type=="Established")].status}',
                check=False,
            )
            return out.returncode == 0 and out.stdout.strip() == "True"

        self.wait_for(f"CRD {name} Established", established, timeout=timeout)

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for this cluster (admin, via the kubeconfig)."""
        from kubernetes import config  # type: ignore[import-untyped]

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    @contextlib.contextmanager
    def namespace(self, name: str) -> Iterator[str]:
        """Create a namespace, wait for its default ServiceAccount, delete it afterwards."""
        self.kubectl_apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if self.options.controller_manager:
            self.wait_for(
                f"serviceaccount {name}/default",
                lambda: (
                    self.kubectl(
                        "get", "serviceaccount", "default", "-n", name, check=False
                    ).returncode
                    == 0
                ),
                timeout=60,
            )
        try:
            yield name
        finally:
            self.kubectl(
                "delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False
            )


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


__all__ = [
    "BINARIES",
    "GPU_RESOURCE",
    "Cluster",
    "ClusterError",
    "ClusterOptions",
    "GpuNode",
    "KeyPair",
    "cache_bin_dir",
    "ensure_binaries",
]

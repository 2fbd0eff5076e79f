"""Kubeflow Trainer v2's controller manager and JobSet's controller, run out of cluster against
the test control plane (the binaries of ``DATALANE_CLUSTER_TRAINER_V2=1 tests/cluster/build.sh``).

What running them outside a cluster takes (found by trying, docs/control-plane.md):

* JobSet: a configuration file without leader election (it cannot find a namespace out of
  cluster) and without its internal certificate management, a serving certificate of our own,
  and its **mutating** webhook registered: JobSet's defaults are set there, and its controller
  dereferences them (a nil pointer panic on every reconcile without it).
* Trainer v2: its cert-controller needs the Secret ``kubeflow-trainer-webhook-cert`` in
  ``kubeflow-system`` and a ValidatingWebhookConfiguration ``validator.trainer.kubeflow.org``
  to exist before it writes certificates, and starts the controllers only then. Its webhooks
  stay unregistered (the CRDs' defaults apply). It writes them to the fixed
  ``/tmp/k8s-webhook-server/serving-certs`` and serves from ``$TMPDIR/...``, so ``TMPDIR``
  stays ``/tmp`` (the training-operator of the harness reads its own ``TMPDIR``; two test
  sessions running Trainer v2 at once on one machine would share that folder).

Callers: tests/operator/test_trainjob_cluster.py. Skips when the binaries are not built.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from datalane_operator.certs import make_bundle

from tests.cluster.harness import Cluster, free_ports

TRAINER_VERSION = "v2.0.0"
JOBSET_VERSION = "v0.8.2"
RUNTIME = "torch-distributed"
JOBSET_WEBHOOK = "datalane-test-jobset"
TRAINER_WEBHOOK = "validator.trainer.kubeflow.org"  # the name its cert-controller patches
TRAINER_NAMESPACE = "kubeflow-system"

# Upstream's ClusterTrainingRuntime torch-distributed (manifests/base/runtimes of v2.0.0),
# with a placeholder image (kwok runs the pods).
TORCH_RUNTIME: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": RUNTIME},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "template": {"spec": {"replicatedJobs": [{
                 "name": "node",
                 "template": {
                     "metadata": {"labels": {
                         "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                     "spec": {"template": {"spec": {"containers": [
                         {"name": "node", "image": "registry.invalid/torch:1"}]}}}}}]}}}}


def _bin_and_share(cluster: Cluster) -> tuple[Path, Path, Path, Path]:
    bin_dir = Path(cluster.bin_dir)
    trainer = bin_dir / f"trainer-controller-manager-{TRAINER_VERSION}"
    jobset = bin_dir / f"jobset-controller-{JOBSET_VERSION}"
    share = bin_dir.parent / "share"
    crds = share / f"trainer-{TRAINER_VERSION}", share / f"jobset-{JOBSET_VERSION}"
    if not (trainer.exists() and jobset.exists() and crds[0].is_dir() and crds[1].is_dir()):
        pytest.fail("Trainer v2 and JobSet controllers not built: run make test-trainer-v2 "
                    "(DATALANE_CLUSTER_TRAINER_V2=1 bash tests/cluster/build.sh, about 15-20 "
                    "min cold), which builds them first")
    return trainer, jobset, crds[0], crds[1]


def _apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=e2e", "-f",
                    "-", input=json.dumps(obj))


def _wait_healthy(url_port: int, proc: subprocess.Popen[bytes], log: Path, what: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{url_port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready in 90 s:\n{log.read_text()[-3000:]}")


@contextmanager
def trainer_v2(cluster: Cluster, workdir: Path) -> Iterator[None]:
    """JobSet's and Trainer v2's controllers running, their CRDs and the torch runtime
    installed; everything cluster-scoped they needed is removed afterwards."""
    trainer_bin, jobset_bin, trainer_crds, jobset_crds = _bin_and_share(cluster)
    for f in [*sorted(jobset_crds.glob("*.yaml")), *sorted(trainer_crds.glob("*.yaml"))]:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=e2e",
                        "-f", str(f))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/jobsets.jobset.x-k8s.io", "crd/trainjobs.trainer.kubeflow.org",
                    "crd/clustertrainingruntimes.trainer.kubeflow.org",
                    "crd/trainingruntimes.trainer.kubeflow.org")
    if cluster.kubectl("get", "namespace", TRAINER_NAMESPACE, check=False).returncode:
        cluster.kubectl("create", "namespace", TRAINER_NAMESPACE)
    cluster.kubectl("create", "secret", "generic", "kubeflow-trainer-webhook-cert", "-n",
                    TRAINER_NAMESPACE, check=False)
    _apply(cluster, {"apiVersion": "admissionregistration.k8s.io/v1",
                     "kind": "ValidatingWebhookConfiguration",
                     "metadata": {"name": TRAINER_WEBHOOK}, "webhooks": []})
    js_port, js_health, tr_health, tr_webhook = free_ports(4)
    tls = make_bundle(["127.0.0.1"], common_name="jobset-webhook")
    certs = workdir / "jobset-certs"
    tls.write(certs)
    _apply(cluster, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": JOBSET_WEBHOOK}, "webhooks": [{
            "name": "mjobset.kb.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {
                "url": f"https://127.0.0.1:{js_port}/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                "caBundle": base64.b64encode(tls.ca_pem).decode()},
            "rules": [{"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
                       "operations": ["CREATE"], "resources": ["jobsets"]}]}]})
    config = workdir / "jobset-config.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{js_health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": js_port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False}}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
           "KUBECONFIG": str(cluster.kubeconfig), "POD_NAMESPACE": TRAINER_NAMESPACE,
           "TMPDIR": "/tmp"}
    setpriv = shutil.which("setpriv")
    pre = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        js_log, tr_log = workdir / "jobset.log", workdir / "trainer.log"
        with open(js_log, "wb") as f:
            procs.append(subprocess.Popen(
                [*pre, str(jobset_bin), "--kubeconfig", str(cluster.kubeconfig), "--config",
                 str(config)], stdout=f, stderr=subprocess.STDOUT, env=env))
        _wait_healthy(js_health, procs[0], js_log, "jobset-controller")
        with open(tr_log, "wb") as f:
            procs.append(subprocess.Popen(
                [*pre, str(trainer_bin), "--kubeconfig", str(cluster.kubeconfig),
                 "--health-probe-bind-address", f"127.0.0.1:{tr_health}",
                 "--metrics-bind-address", "0", "--webhook-server-port", str(tr_webhook)],
                stdout=f, stderr=subprocess.STDOUT, env=env))
        _wait_healthy(tr_health, procs[1], tr_log, "trainer-controller-manager")
        _apply(cluster, TORCH_RUNTIME)
        yield
    finally:
        for p in procs:  # SIGTERM to both at once, then 15 s for both together
            p.terminate()
        deadline = time.monotonic() + 15
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait()
        cluster.kubectl("delete", f"mutatingwebhookconfiguration/{JOBSET_WEBHOOK}",
                        f"validatingwebhookconfiguration/{TRAINER_WEBHOOK}",
                        "--ignore-not-found", check=False)

"""Kubeflow Trainer v2's controller manager and JobSet's controller, run out of cluster against
a :class:`~playground.cluster.Cluster` (the binaries of
``DATALANE_CLUSTER_TRAINER_V2=1 tests/cluster/build.sh``).

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
  stays ``/tmp`` (the training-operator of the cluster reads its own ``TMPDIR``; two clusters
  running Trainer v2 at once on one machine would share that folder).

Both join the cluster's processes (``jobset-controller``, ``trainer-controller-manager``), so
``Cluster.stop`` ends them, ``check_alive`` watches them and ``diagnostics`` shows their logs.

Callers: the playground (``python -m playground up --trainer-v2``) and
tests/operator/test_trainjob_cluster.py (:func:`trainer_v2` around one test of a shared
cluster).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster, ClusterError, Process, free_ports, share_dir

TRAINER_VERSION = "v2.0.0"
JOBSET_VERSION = "v0.8.2"
RUNTIME = "torch-distributed"
JOBSET_WEBHOOK = "datalane-test-jobset"
TRAINER_WEBHOOK = "validator.trainer.kubeflow.org"  # the name its cert-controller patches
TRAINER_NAMESPACE = "kubeflow-system"
PROCESSES = ("jobset-controller", "trainer-controller-manager")

# Upstream's ClusterTrainingRuntime torch-distributed (manifests/base/runtimes of v2.0.0),
# with a placeholder image (the TrainJob names its own).
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


def binaries(cluster: Cluster) -> tuple[Path, Path, Path, Path]:
    """(trainer binary, jobset binary, trainer CRDs folder, jobset CRDs folder)."""
    bin_dir = Path(cluster.bin_dir)
    trainer = bin_dir / f"trainer-controller-manager-{TRAINER_VERSION}"
    jobset = bin_dir / f"jobset-controller-{JOBSET_VERSION}"
    share = share_dir(bin_dir)
    crds = share / f"trainer-{TRAINER_VERSION}", share / f"jobset-{JOBSET_VERSION}"
    if not (trainer.exists() and jobset.exists() and crds[0].is_dir() and crds[1].is_dir()):
        raise ClusterError(
            f"Trainer v2 and JobSet controllers not built in {bin_dir}: run make "
            "test-trainer-v2 or DATALANE_CLUSTER_TRAINER_V2=1 bash tests/cluster/build.sh "
            "(about 15-20 min cold)")
    return trainer, jobset, crds[0], crds[1]


def _apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=datalane",
                    "-f", "-", input=json.dumps(obj))


def _ready(cluster: Cluster, name: str, port: int) -> None:
    cluster.wait_for(f"{name} /readyz",
                     lambda: cluster._http_ok(f"http://127.0.0.1:{port}/readyz"), timeout=90)


def start_trainer_v2(cluster: Cluster) -> None:
    """JobSet's and Trainer v2's controllers running, their CRDs and the torch runtime
    installed (a no-op when they run already)."""
    if PROCESSES[0] in cluster.processes:
        return
    trainer_bin, jobset_bin, trainer_crds, jobset_crds = binaries(cluster)
    for f in [*sorted(jobset_crds.glob("*.yaml")), *sorted(trainer_crds.glob("*.yaml"))]:
        cluster.kubectl("apply", "--server-side", "--force-conflicts",
                        "--field-manager=datalane", "-f", str(f))
    for crd in ("jobsets.jobset.x-k8s.io", "trainjobs.trainer.kubeflow.org",
                "clustertrainingruntimes.trainer.kubeflow.org",
                "trainingruntimes.trainer.kubeflow.org"):
        cluster.wait_crd_established(crd)
    if cluster.kubectl("get", "namespace", TRAINER_NAMESPACE, check=False).returncode:
        cluster.kubectl("create", "namespace", TRAINER_NAMESPACE)
    cluster.kubectl("create", "secret", "generic", "kubeflow-trainer-webhook-cert", "-n",
                    TRAINER_NAMESPACE, check=False)
    _apply(cluster, {"apiVersion": "admissionregistration.k8s.io/v1",
                     "kind": "ValidatingWebhookConfiguration",
                     "metadata": {"name": TRAINER_WEBHOOK}, "webhooks": []})
    js_port, js_health, tr_health, tr_webhook = free_ports(4)
    work = cluster.wd / "trainer-v2"
    certs = work / "jobset-certs"
    certs.mkdir(parents=True, exist_ok=True)
    assert cluster.ca is not None
    cluster.ca.issue("jobset-webhook", ip_addresses=["127.0.0.1"]).write(
        certs / "tls.crt", certs / "tls.key")
    _apply(cluster, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": JOBSET_WEBHOOK}, "webhooks": [{
            "name": "mjobset.kb.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {
                "url": f"https://127.0.0.1:{js_port}/mutate-jobset-x-k8s-io-v1alpha2-jobset",
                "caBundle": base64.b64encode(cluster.ca_pem).decode()},
            "rules": [{"apiGroups": ["jobset.x-k8s.io"], "apiVersions": ["v1alpha2"],
                       "operations": ["CREATE"], "resources": ["jobsets"]}]}]})
    config = work / "jobset-config.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{js_health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": js_port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False}}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
           "KUBECONFIG": str(cluster.kubeconfig), "POD_NAMESPACE": TRAINER_NAMESPACE,
           "TMPDIR": "/tmp"}
    jobset, trainer = PROCESSES
    cluster.processes[jobset] = p = Process(
        jobset, [str(jobset_bin), "--kubeconfig", str(cluster.kubeconfig), "--config",
                 str(config)], cluster.logs_dir / f"{jobset}.log", env=env)
    p.start()
    _ready(cluster, jobset, js_health)
    cluster.processes[trainer] = p = Process(
        trainer, [str(trainer_bin), "--kubeconfig", str(cluster.kubeconfig),
                  "--health-probe-bind-address", f"127.0.0.1:{tr_health}",
                  "--metrics-bind-address", "0", "--webhook-server-port", str(tr_webhook)],
        cluster.logs_dir / f"{trainer}.log", env=env)
    p.start()
    _ready(cluster, trainer, tr_health)
    _apply(cluster, TORCH_RUNTIME)


def stop_trainer_v2(cluster: Cluster) -> None:
    """Both controllers stopped and the webhook configurations that name them removed (the
    CRDs and the runtime stay)."""
    for name in reversed(PROCESSES):
        p = cluster.processes.pop(name, None)
        if p is not None:
            p.stop()
    cluster.kubectl("delete", f"mutatingwebhookconfiguration/{JOBSET_WEBHOOK}",
                    f"validatingwebhookconfiguration/{TRAINER_WEBHOOK}",
                    "--ignore-not-found", check=False)


@contextmanager
def trainer_v2(cluster: Cluster) -> Iterator[None]:
    """Trainer v2 and JobSet running for the body of the ``with`` (one test of a cluster that
    other tests share: everything cluster-scoped that names them is removed afterwards)."""
    try:
        start_trainer_v2(cluster)
        yield
    finally:
        stop_trainer_v2(cluster)

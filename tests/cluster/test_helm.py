"""helm lint / template / install of a tiny chart into the real cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from kubernetes import client

from .harness import Cluster
from .util import eventually

CHART = Path(__file__).parent / "testdata" / "tinychart"


def test_helm_lint_and_template(k8s_cluster: Cluster):
    lint = k8s_cluster.helm("lint", str(CHART))
    assert "0 chart(s) failed" in lint.stdout

    out = k8s_cluster.helm("template", "demo", str(CHART), "--set", "replicas=2").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": 1}


def test_helm_install_into_cluster(
    k8s_cluster: Cluster, k8s_api: client.ApiClient, k8s_namespace: str
):
    ns = k8s_namespace
    k8s_cluster.helm("install", "demo", str(CHART), "-n", ns, "--wait", "--timeout", "120s")
    status = k8s_cluster.helm("status", "demo", "-n", ns, "-o", "json").stdout
    assert '"status":"deployed"' in status.replace(" ", "")

    core = client.CoreV1Api(k8s_api)
    cm = core.read_namespaced_config_map("demo-config", ns)
    assert cm.data["message"] == "hello from tinychart"
    # Capabilities.KubeVersion comes from the live apiserver at install time.
    server_version = client.VersionApi(k8s_api).get_code().git_version
    assert cm.data["kubeVersion"] == server_version

    # Deployment -> ReplicaSet (controller-manager) -> Pod scheduled on a fake GPU node
    # (kube-scheduler) -> Running (kwok).
    def running_pod() -> client.V1Pod | None:
        pods = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/instance=demo")
        run = [p for p in pods.items if p.status.phase == "Running"]
        return run[0] if run else None

    pod = eventually(running_pod, timeout=90, what="the chart's pod to run")
    assert pod.spec.node_name.startswith("kwok-gpu-")

    k8s_cluster.helm("upgrade", "demo", str(CHART), "-n", ns, "--set", "message=upgraded")
    assert core.read_namespaced_config_map("demo-config", ns).data["message"] == "upgraded"
    k8s_cluster.helm("uninstall", "demo", "-n", ns, "--wait", "--timeout", "120s")
    assert not core.list_namespaced_config_map(
        ns, label_selector="app.kubernetes.io/instance=demo"
    ).items


def test_helm_kube_version_constraint_is_checked_against_the_server(
    k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path
):
    chart = tmp_path / "oldchart"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["kubeVersion"] = "<1.20.0-0"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    out = k8s_cluster.helm("install", "old", str(chart), "-n", k8s_namespace, check=False)
    assert out.returncode != 0
    assert "incompatible with Kubernetes" in out.stderr, out.stderr

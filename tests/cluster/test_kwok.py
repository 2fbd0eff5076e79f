"""kwok plays fake GPU nodes: pods are scheduled onto them and marked Running."""

from __future__ import annotations

from kubernetes import client

from .harness import GPU_RESOURCE, Cluster
from .util import eventually


def gpu_pod(name: str, gpus: int) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "gpu-test"}),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="registry.invalid/trainer:1",
                    resources=client.V1ResourceRequirements(limits={GPU_RESOURCE: str(gpus)}),
                )
            ],
        ),
    )


def test_fake_gpu_nodes_are_ready(k8s_cluster: Cluster, k8s_api: client.ApiClient):
    nodes = client.CoreV1Api(k8s_api).list_node(label_selector="type=kwok").items
    names = sorted(n.metadata.name for n in nodes)
    assert names == [n.name for n in k8s_cluster.options.nodes]
    for n in nodes:
        assert n.status.allocatable[GPU_RESOURCE] == "8"
        ready = {c.type: c.status for c in n.status.conditions}
        assert ready["Ready"] == "True"


def test_kwok_marks_pod_running_on_fake_gpu_node(k8s_api: client.ApiClient, k8s_namespace: str):
    core = client.CoreV1Api(k8s_api)
    core.create_namespaced_pod(k8s_namespace, gpu_pod("trainer", gpus=4))

    def running() -> client.V1Pod | None:
        p = core.read_namespaced_pod("trainer", k8s_namespace)
        return p if p.status.phase == "Running" else None

    pod = eventually(running, timeout=60, what="pod Running")
    assert pod.spec.node_name.startswith("kwok-gpu-")
    assert pod.status.pod_ip
    assert pod.status.container_statuses[0].ready

    # More GPUs than any node has: the real scheduler leaves it Pending, Unschedulable.
    core.create_namespaced_pod(k8s_namespace, gpu_pod("too-big", gpus=9))

    def unschedulable() -> bool:
        p = core.read_namespaced_pod("too-big", k8s_namespace)
        conds = {c.type: c for c in (p.status.conditions or [])}
        c = conds.get("PodScheduled")
        return bool(c and c.status == "False" and c.reason == "Unschedulable")

    eventually(unschedulable, timeout=60, what="scheduler to mark the pod Unschedulable")
    assert core.read_namespaced_pod("too-big", k8s_namespace).status.phase == "Pending"

    # Deleting a pod on a fake node completes (kwok acts as the kubelet).
    core.delete_namespaced_pod("trainer", k8s_namespace)

    def deleted() -> bool:
        return not [
            p for p in core.list_namespaced_pod(k8s_namespace).items if p.metadata.name == "trainer"
        ]

    eventually(deleted, timeout=60, what="pod deletion")

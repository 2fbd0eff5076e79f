"""Kubeflow training-operator v1.9 (the real one, built by build.sh) runs PyTorchJobs here.

Pods are created for missing replica indices and deleted for indices beyond the replica
count when Worker.replicas changes through the scale subresource; kwok runs them.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .harness import GPU_RESOURCE, Cluster
from .util import eventually

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
JOB_NAME = "training.kubeflow.org/job-name"
RTYPE = "training.kubeflow.org/replica-type"
RINDEX = "training.kubeflow.org/replica-index"
OPERATOR = "training.kubeflow.org/operator-name"


def replica(n: int, container: str = "pytorch") -> dict[str, object]:
    return {
        "replicas": n,
        "restartPolicy": "OnFailure",
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": container,
                        "image": "registry.invalid/trainer:1",
                        "resources": {"limits": {GPU_RESOURCE: "1"}},
                    }
                ]
            }
        },
    }


def job(
    name: str, workers: int, container: str = "pytorch", elastic: bool = False
) -> dict[str, object]:
    spec: dict[str, object] = {
        "pytorchReplicaSpecs": {
            "Master": replica(1, container),
            "Worker": replica(workers, container),
        },
    }
    if elastic:
        spec["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 4, "rdzvBackend": "c10d"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def pods_by_name(core: client.CoreV1Api, ns: str, name: str) -> dict[str, client.V1Pod]:
    pods = core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME}={name}").items
    return {p.metadata.name: p for p in pods if p.metadata.deletion_timestamp is None}


def test_webhook_rejects_job_without_pytorch_container(
    training_operator: Cluster, k8s_api: client.ApiClient, k8s_namespace: str
):
    api = client.CustomObjectsApi(k8s_api)
    with pytest.raises(ApiException) as exc:
        api.create_namespaced_custom_object(
            GROUP, VERSION, k8s_namespace, PLURAL, job("bad", 1, container="main")
        )
    assert "must have at least one container with name pytorch" in exc.value.body


def test_pytorchjob_pods_follow_worker_scale(
    training_operator: Cluster, k8s_api: client.ApiClient, k8s_namespace: str
):
    ns, name = k8s_namespace, "ddp"
    api = client.CustomObjectsApi(k8s_api)
    core = client.CoreV1Api(k8s_api)
    api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job(name, 2, elastic=True))

    def pods_are(expected: set[str]) -> dict[str, client.V1Pod] | None:
        got = pods_by_name(core, ns, name)
        return got if set(got) == expected else None

    pods = eventually(
        lambda: pods_are({f"{name}-master-0", f"{name}-worker-0", f"{name}-worker-1"}),
        timeout=90,
        what="master-0, worker-0, worker-1",
    )
    for pod_name, pod in pods.items():
        rtype, index = pod_name.split("-")[1:]
        labels = pod.metadata.labels
        assert labels[JOB_NAME] == name
        assert labels[RTYPE] == rtype
        assert labels[RINDEX] == index
        assert labels[OPERATOR] == "pytorchjob-controller"
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        rank = int(index) + (1 if rtype == "worker" else 0)
        assert env["RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == f"{name}-master-0"
        assert env["MASTER_PORT"] == "23456"
        # elastic mode: rendezvous on worker-0
        assert env["PET_RDZV_ENDPOINT"] == f"{name}-worker-0:23456"
        assert env["PET_NNODES"] == "1:4"
        # env goes to spec.containers only, never to init containers
        for ic in pod.spec.init_containers or []:
            assert not {e.name for e in ic.env or []} & {"RANK", "WORLD_SIZE", "MASTER_ADDR"}
    # kwok runs them on the fake GPU nodes
    eventually(
        lambda: all(p.status.phase == "Running" for p in pods_by_name(core, ns, name).values()),
        timeout=90,
        what="job pods Running",
    )

    # Scale up Worker through the scale subresource: a pod for the missing index appears.
    api.patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, PLURAL, name, {"spec": {"replicas": 3}}
    )
    got = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    assert got["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    eventually(
        lambda: pods_are({f"{name}-master-0"} | {f"{name}-worker-{i}" for i in range(3)}),
        timeout=90,
        what="worker-2 created",
    )

    # Scale down: pods for indices beyond the replica count are deleted.
    api.patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, PLURAL, name, {"spec": {"replicas": 1}}
    )
    eventually(
        lambda: pods_are({f"{name}-master-0", f"{name}-worker-0"}),
        timeout=90,
        what="worker-1 and worker-2 deleted",
    )

    # Deleting the job removes its pods (owner references + garbage collector).
    api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    eventually(lambda: not pods_by_name(core, ns, name), timeout=90, what="job pods gone")

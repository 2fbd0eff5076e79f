"""Builders of the objects the operator sees: DataPipelines, PyTorchJobs, pods, Scales."""

from __future__ import annotations

import copy
from typing import Any

RECIPE: dict[str, Any] = {
    "seq_len": 128,
    "seed": 5,
    "tokenizer": {"uri": "s3://data/tokenizer.json"},
    "sources": [
        {"name": "web", "uris": ["s3://data/web/*.parquet"], "weight": 0.7},
        {"name": "code", "uris": ["s3://data/code/part-0.jsonl.zst"], "weight": 0.3},
    ],
    "shuffle": {"block_size": 16},
}


RECIPE_CONFIGMAP_META: dict[str, Any] = {
    "labels": {"datalane.io/pipeline": "pretrain",
               "app.kubernetes.io/managed-by": "datalane-operator"},
    "ownerReferences": [{"apiVersion": "datalane.io/v1alpha1", "kind": "DataPipeline",
                         "name": "pretrain", "uid": "uid-1", "controller": True,
                         "blockOwnerDeletion": False}]}
"""The labels and owner of a recipe ConfigMap of ``dp()``, as the operator writes them."""


def dp(name: str = "pretrain", *, namespace: str = "ml", workload: str = "llama",
       lanes: int = 8, batch: int = 16, recipe: dict[str, Any] | None = None,
       **spec: Any) -> dict[str, Any]:
    """A DataPipeline object as the API server would send it (minus defaults)."""
    body: dict[str, Any] = {
        "apiVersion": "datalane.io/v1alpha1",
        "kind": "DataPipeline",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
        "spec": {
            "workload": {"name": workload},
            "lanes": lanes,
            "globalBatchSize": batch,
            "recipe": copy.deepcopy(RECIPE if recipe is None else recipe),
            "checkpoint": {"uri": "s3://ckpt/run-1", "secretRef": {"name": "s3-creds"},
                           "endpoint": "http://minio.storage:9000", "keep": 2},
            "sidecar": {"image": "registry.example/datalane-sidecar:0.1.0",
                        "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                      "limits": {"memory": "8Gi"}}},
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


def replica(n: int, gpus: int | None = 1, container: str = "pytorch") -> dict[str, Any]:
    limits = {} if gpus is None else {"nvidia.com/gpu": str(gpus)}
    return {"replicas": n, "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [
                {"name": container, "image": "trainer:1", "resources": {"limits": limits}}]}}}


def job(name: str = "llama", *, workers: int = 4, master: int = 0, nproc: Any = "1",
        gpus: int | None = 1, namespace: str = "ml") -> dict[str, Any]:
    specs = {"Worker": replica(workers, gpus)}
    if master:
        specs["Master"] = replica(master, gpus)
    spec: dict[str, Any] = {"pytorchReplicaSpecs": specs}
    if nproc is not None:
        spec["nprocPerNode"] = nproc
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def scale(replicas: int, name: str = "llama") -> dict[str, Any]:
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": "ml"}, "spec": {"replicas": replicas}}


def pod(name: str = "llama-worker-0", *, job_name: str | None = "llama", nproc: str = "1",
        gpus: int = 1, namespace: str = "ml", phase: str | None = None, nnodes: str = "4",
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    labels = {} if job_name is None else {
        "training.kubeflow.org/job-name": job_name,
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": name.rsplit("-", 1)[-1]}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "containers": [
                {"name": "pytorch", "image": "trainer:1",
                 "env": [{"name": "PET_NPROC_PER_NODE", "value": nproc},
                         {"name": "PET_NNODES", "value": nnodes}],
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "metrics-agent", "image": "agent:2"},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "restartPolicy": "OnFailure",
        },
    }
    if init is not None:
        body["spec"]["initContainers"] = init
    if phase is not None:
        body["status"] = {"phase": phase,
                          "conditions": [{"type": "Ready",
                                          "status": "True" if phase == "Running" else "False"}]}
    return body


def trainjob(name: str = "llama", *, nodes: int | None = 4, nproc: Any = "1",
             gpus: int | None = 1, namespace: str = "ml") -> dict[str, Any]:
    """A Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) on the torch runtime."""
    trainer: dict[str, Any] = {"image": "trainer:1"}
    if nodes is not None:
        trainer["numNodes"] = nodes
    if nproc is not None:
        trainer["numProcPerNode"] = nproc
    if gpus is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer}}


def jobset_pod(name: str = "llama-node-0-0", *, jobset: str = "llama", index: int = 0,
               replicated_job: str = "node", container: str = "node", nproc: str = "1",
               nnodes: str = "4", gpus: int = 1, namespace: str = "ml") -> dict[str, Any]:
    """A pod as JobSet creates it for a TrainJob: the labels JobSet and the indexed Job set, the
    PET_ variables Trainer v2's torch plugin sets on the trainer container."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {
            "jobset.sigs.k8s.io/jobset-name": jobset,
            "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
            "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": str(index)},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
        "spec": {
            "containers": [
                {"name": container, "image": "trainer:1",
                 "env": [{"name": "PET_NNODES", "value": nnodes},
                         {"name": "PET_NPROC_PER_NODE", "value": nproc},
                         {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                             "fieldPath": "metadata.annotations['batch.kubernetes.io/"
                                          "job-completion-index']"}}}],
                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}},
            ],
            "restartPolicy": "OnFailure",
        },
    }

"""A TrainJob as a DataPipeline's workload on the real API server (issue 22 part 2).

The chart and the operator (tests/operator/stack.py) on the test control plane, with Kubeflow
Trainer v2's TrainJob CRD (a trimmed test fixture of v2.0.0's, testdata/) and no Trainer v2 or
JobSet controller: the test plays them, creating the TrainJob and the pods JobSet would.

* The validating webhook guards a resize, an UPDATE of ``spec.trainer.numNodes`` (a TrainJob has
  no scale subresource): with 8 lanes, 9 nodes is refused with the counts that work and the
  stored TrainJob keeps 4; 8 nodes is admitted.
* Pods labelled as the TrainJob's JobSet's trainer (``jobset.sigs.k8s.io/jobset-name``,
  replicated job ``node``) get the sidecar and the trainer's environment; a pod of its dataset
  initializer does not.
* The status counts the TrainJob's nodes and ranks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from datalane_operator import names
from kubernetes import client
from kubernetes.client.rest import ApiException

from playground.trainerv2 import RUNTIME, trainer_v2
from tests.cluster.harness import Cluster
from tests.cluster.util import eventually

from .builders import RECIPE, jobset_pod, trainjob
from .stack import Stack, datalane_stack
from .test_e2e import apply, dp_status, pipeline

pytestmark = [pytest.mark.cluster]
CRD = Path(__file__).parent / "testdata" / "trainjobs.trainer.kubeflow.org.yaml"
TG, TV, TP = names.TRAINJOB_GROUP, names.TRAINJOB_VERSION, names.TRAINJOB_PLURAL


@pytest.fixture
def stack(k8s_cluster: Cluster, k8s_namespace: str, tmp_path: Path) -> Iterator[Stack]:
    k8s_cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=e2e",
                        "-f", str(CRD))
    k8s_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        f"customresourcedefinitions/{TP}.{TG}")
    with datalane_stack(k8s_cluster, k8s_namespace, tmp_path) as s:
        yield s


def num_nodes(custom: client.CustomObjectsApi, ns: str, name: str, nodes: int,
              dry_run: bool = False) -> None:
    custom.patch_namespaced_custom_object(
        TG, TV, ns, TP, name, {"spec": {"trainer": {"numNodes": nodes}}},
        **({"dry_run": "All"} if dry_run else {}))


def refusal(fn: Any) -> str | None:
    try:
        fn()
    except ApiException as e:
        return str(json.loads(e.body).get("message"))
    return None


def injected(pod: dict[str, Any]) -> bool:
    return any(c["name"] == names.SIDECAR_CONTAINER
               for c in pod["spec"].get("initContainers") or [])


def test_train_job_resize_guard_injection_and_status(stack: Stack,
                                                     k8s_api: client.ApiClient) -> None:
    c, ns = stack.cluster, stack.namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    body = pipeline("tj", "llama", json.loads(json.dumps(RECIPE)),
                    {"uri": f"file://{stack.log.parent}/store"})
    body["spec"]["workload"] = {"kind": "TrainJob", "name": "llama"}
    apply(c, ns, body)
    job = trainjob(nodes=4, nproc=1, namespace=ns)
    custom.create_namespaced_custom_object(TG, TV, ns, TP, job)

    # ---- the guard on spec.trainer.numNodes -------------------------------------------
    # the API server takes up the webhook configuration asynchronously: dry runs until it bites
    eventually(lambda: refusal(lambda: num_nodes(custom, ns, "llama", 9, dry_run=True)),
               timeout=60, what="the TrainJob webhook to refuse 9 nodes")
    message = refusal(lambda: num_nodes(custom, ns, "llama", 9))
    assert message is not None and message.endswith(
        "spec.trainer.numNodes 9: 8 lanes cannot be split over 9 nodes; use 1 to 8 "
        "(DataPipeline tj)"), message
    stored = custom.get_namespaced_custom_object(TG, TV, ns, TP, "llama")
    assert stored["spec"]["trainer"]["numNodes"] == 4
    num_nodes(custom, ns, "llama", 8)
    stored = custom.get_namespaced_custom_object(TG, TV, ns, TP, "llama")
    assert stored["spec"]["trainer"]["numNodes"] == 8

    # ---- the JobSet's trainer pods get the sidecar, its initializer's do not -----------
    def probe_injected() -> bool:
        resp = core.create_namespaced_pod(ns, jobset_pod("probe", namespace=ns),
                                          dry_run="All", _preload_content=False)
        return injected(json.loads(resp.data))

    eventually(probe_injected, timeout=60, what="the JobSet pod injection webhook")
    for i in range(2):
        core.create_namespaced_pod(ns, jobset_pod(f"llama-node-0-{i}", index=i, nnodes="8",
                                                  namespace=ns))
    init = jobset_pod("llama-dataset-initializer-0-0", replicated_job="dataset-initializer",
                      container="dataset-initializer", namespace=ns)
    core.create_namespaced_pod(ns, init)
    pods = {p["metadata"]["name"]: p for p in json.loads(core.list_namespaced_pod(
        ns, label_selector=f"{names.JOBSET_NAME_LABEL}=llama", _preload_content=False).data)[
        "items"]}
    assert injected(pods["llama-node-0-0"]) and injected(pods["llama-node-0-1"])
    assert not injected(pods["llama-dataset-initializer-0-0"])
    (node,) = pods["llama-node-0-1"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in node["env"]}
    assert env["DATALANE_PIPELINE"] == "tj"
    assert env["DATALANE_SOCKET"] == f"{names.DEFAULT_SOCKET_DIR}/{names.SOCKET_FILE}"
    assert pods["llama-node-0-1"]["metadata"]["labels"][names.LABEL_PIPELINE] == "tj"

    # ---- the status counts the TrainJob's nodes ----------------------------------------
    eventually(lambda: dp_status(custom, ns, "tj").get("pods") == 8, timeout=60,
               what="the DataPipeline status to count 8 nodes")
    s = dp_status(custom, ns, "tj")
    assert (s["ranksPerPod"], s["ranks"], s["worldSize"], s["lanesPerRank"]) == (1, 8, 8, 1)


@pytest.mark.trainer_v2
def test_real_trainer_v2_and_jobset_pods_are_injected_and_resizes_guarded(
        stack: Stack, k8s_api: client.ApiClient) -> None:
    """Trainer v2.0.0 and JobSet v0.8.2 themselves (playground/trainerv2.py): a TrainJob of
    2 nodes becomes a JobSet whose indexed Job's pods the datalane webhook injects; the
    status counts them; a resize to 9 nodes is refused before either controller sees it."""
    c, ns = stack.cluster, stack.namespace
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    with trainer_v2(c):
        body = pipeline("tj2", "llm", json.loads(json.dumps(RECIPE)),
                        {"uri": f"file://{stack.log.parent}/store2"})
        body["spec"]["workload"] = {"kind": "TrainJob", "name": "llm"}
        apply(c, ns, body)

        def probe_injected() -> bool:
            resp = core.create_namespaced_pod(ns, jobset_pod("probe", jobset="llm",
                                                             namespace=ns),
                                              dry_run="All", _preload_content=False)
            return injected(json.loads(resp.data))

        eventually(probe_injected, timeout=60, what="the JobSet pod injection webhook")
        job = trainjob("llm", nodes=2, nproc=1, namespace=ns)
        job["spec"]["runtimeRef"] = {"name": RUNTIME}
        custom.create_namespaced_custom_object(TG, TV, ns, TP, job)

        def trainer_pods() -> dict[str, dict[str, Any]] | None:
            items = json.loads(core.list_namespaced_pod(
                ns, label_selector=f"{names.JOBSET_NAME_LABEL}=llm",
                _preload_content=False).data)["items"]
            return {p["metadata"]["name"]: p for p in items} if len(items) == 2 else None

        pods = eventually(trainer_pods, timeout=90,
                          what="Trainer v2 and JobSet to create 2 pods of TrainJob llm")
        for p in pods.values():
            labels = p["metadata"]["labels"]
            assert labels[names.JOBSET_REPLICATED_JOB_LABEL] == "node"
            assert injected(p), p["metadata"]["name"]
            (node,) = p["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in node["env"]}
            # Trainer v2's torch plugin set these; the webhook added DATALANE_*
            assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("2", "1")
            assert env["DATALANE_PIPELINE"] == "tj2"
        ranks = sorted(int(p["metadata"]["labels"][names.JOB_COMPLETION_INDEX])
                       for p in pods.values())
        assert ranks == [0, 1]
        eventually(lambda: dp_status(custom, ns, "tj2").get("pods") == 2, timeout=60,
                   what="the DataPipeline status to count 2 nodes")
        assert dp_status(custom, ns, "tj2")["worldSize"] == 2
        message = refusal(lambda: num_nodes(custom, ns, "llm", 9))
        assert message is not None and "spec.trainer.numNodes 9: 8 lanes cannot be split " \
            "over 9 nodes; use 1 to 8 (DataPipeline tj2)" in message, message

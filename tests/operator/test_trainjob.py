"""Kubeflow Trainer v2's TrainJob as a DataPipeline's workload (issue 22 part 2): the registry
(which pods are the trainer's, node ranks), the world (numNodes x numProcPerNode), the scale
guard on spec.trainer.numNodes, the injection into JobSet pods, and the status.

Every expectation is worked out by hand from Trainer v2.0.0's torch plugin and JobSet v0.8.2's
pod labels (see the builders)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kopf
import pytest
from datalane_operator import handlers
from datalane_operator.admission import review_workload
from datalane_operator.inject import mutate_pod, pipeline_for_pod
from datalane_operator.kinds import PYTORCHJOB, TRAINJOB, kind_named, trainer_pod_of
from datalane_operator.pipeline import Parallelism, load_pipeline
from datalane_operator.reconcile import decide
from datalane_operator.runtime import Runtime
from datalane_operator.workload import check_workers, trainjob_topology_of

from datalane.spec.errors import ConfigError

from .builders import dp, job, jobset_pod, pod, trainjob

T0 = "2026-01-01T00:00:00Z"
TRAINJOB_REF = {"name": "llama", "kind": "TrainJob"}


def tj_pipeline(workload: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = dp(**spec)
    body["spec"]["workload"] = dict(workload or TRAINJOB_REF)
    return body


# -- the world ------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "pods", "nproc"), [
    (trainjob(nodes=4, nproc="2"), 4, 2),
    (trainjob(nodes=4, nproc=2), 4, 2),            # an int-or-string: the int form
    (trainjob(nodes=2, nproc="gpu", gpus=8), 2, 8),
    (trainjob(nodes=2, nproc="auto", gpus=4), 2, 4),
])
def test_world_is_num_nodes_by_num_proc_per_node(body, pods, nproc) -> None:  # type: ignore[no-untyped-def]
    t = trainjob_topology_of(body)
    assert (t.pods, t.nproc, t.ranks, t.dp_size) == (pods, nproc, pods * nproc, pods * nproc)
    assert t.others == 0  # no Master: every pod is a node


@pytest.mark.parametrize(("body", "reason"), [
    (trainjob(nodes=None), "spec.trainer.numNodes is not set, so the training runtime's "
                           "mlPolicy.numNodes decides the pods"),
    (trainjob(nproc=None), "spec.trainer.numProcPerNode is not set, so the training runtime's "
                           "mlPolicy.torch.numProcPerNode decides the ranks per pod"),
    (trainjob(nproc="cpu", gpus=None), "numProcPerNode 'cpu' depends on the node's CPU count; "
                                       "set an integer numProcPerNode or an integer cpu limit"),
])
def test_world_left_to_the_runtime_is_unknown(body, reason) -> None:  # type: ignore[no-untyped-def]
    t = trainjob_topology_of(body)
    assert t.nproc is None and t.ranks is None
    assert t.nproc_source.startswith(reason), t.nproc_source
    check_workers(8, t)  # unknown: not refused here (a warning and a condition instead)


def test_guard_speaks_of_nodes() -> None:
    with pytest.raises(ConfigError) as e:
        check_workers(8, trainjob_topology_of(trainjob(nodes=9)))
    assert str(e.value) == "8 lanes cannot be split over 9 nodes; use 1 to 8"
    with pytest.raises(ConfigError) as e:
        check_workers(8, trainjob_topology_of(trainjob(nodes=5, nproc="2")))
    # 10 ranks > 8 lanes; even DP sizes 2, 4, 6, 8 are 1 to 4 pods of 2 ranks
    assert str(e.value) == ("8 lanes cannot be split over 5 nodes (world size 10: 5 pods x 2 "
                            "ranks); use 1 to 4 nodes")
    with pytest.raises(ConfigError) as e:
        check_workers(8, trainjob_topology_of(trainjob(nodes=20, nproc="2"),
                                              parallelism=Parallelism(tensor=2)))
    # 40 ranks / TP 2 = DP 20 > 8; each pod is one DP rank, so 1 to 8 pods
    assert str(e.value) == ("8 lanes cannot be split over 20 nodes (world size 40: 20 pods x 2 "
                            "ranks, TP 2 -> DP 20); use 1 to 8 nodes")
    check_workers(8, trainjob_topology_of(trainjob(nodes=8)))


def test_review_names_num_nodes_and_the_pipeline() -> None:
    v = review_workload(trainjob(nodes=9), 8, "pretrain", "node", None, TRAINJOB)
    assert not v.allowed
    assert v.message == ("spec.trainer.numNodes 9: 8 lanes cannot be split over 9 nodes; use 1 "
                         "to 8 (DataPipeline pretrain)")
    assert review_workload(trainjob(nodes=8), 8, "pretrain", "node", None, TRAINJOB).allowed
    unknown = review_workload(trainjob(nodes=None), 8, "pretrain", "node", None, TRAINJOB)
    assert unknown.allowed and "spec.trainer.numNodes is not set" in unknown.warnings[0]
    # a PyTorchJob's refusal keeps its words (kubectl scale sets the Worker replicas)
    assert review_workload(job(workers=9), 8, "pretrain").message == (
        "8 lanes cannot be split over 9 workers; use 1 to 8 (DataPipeline pretrain)")


# -- the registry ---------------------------------------------------------------------------


def test_which_pods_are_the_trainers() -> None:
    assert trainer_pod_of(jobset_pod()) == (TRAINJOB, "llama")
    assert trainer_pod_of(pod()) == (PYTORCHJOB, "llama")
    # the JobSet's initializer pods carry the JobSet's name but are not the trainer's
    assert trainer_pod_of(jobset_pod("llama-dataset-initializer-0-0",
                                     replicated_job="dataset-initializer")) is None
    assert trainer_pod_of({"metadata": {"labels": {"app": "web"}}}) is None
    assert TRAINJOB.selector("llama") == ("jobset.sigs.k8s.io/jobset-name=llama,"
                                          "jobset.sigs.k8s.io/replicatedjob-name=node")
    assert PYTORCHJOB.selector("llama") == "training.kubeflow.org/job-name=llama"


def test_node_rank() -> None:
    assert TRAINJOB.node_rank(jobset_pod(index=3), trainjob()) == 3
    no_label = jobset_pod(index=2)
    del no_label["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
    assert TRAINJOB.node_rank(no_label, trainjob()) == 2  # the annotation (PET_NODE_RANK's)
    master = pod("llama-master-0")
    master["metadata"]["labels"]["training.kubeflow.org/replica-type"] = "master"
    assert PYTORCHJOB.node_rank(master, job(workers=4, master=1)) == 0
    # Worker 2 behind one Master is node 3 (the training-operator's RANK)
    assert PYTORCHJOB.node_rank(pod("llama-worker-2"), job(workers=4, master=1)) == 3
    assert PYTORCHJOB.node_rank(pod("llama-worker-2"), job(workers=4)) == 2


def test_kinds_by_name() -> None:
    assert kind_named("TrainJob") is TRAINJOB and kind_named(None) is PYTORCHJOB
    with pytest.raises(ConfigError, match=r"spec\.workload\.kind 'MPIJob' is not one of "
                                          "PyTorchJob, TrainJob"):
        kind_named("MPIJob")


def test_pipeline_accepts_train_job_and_defaults_its_container() -> None:
    p = load_pipeline(tj_pipeline())
    assert (p.spec.workload.kind, p.spec.workload.trainer) == ("TrainJob", "node")
    assert load_pipeline(dp()).spec.workload.trainer == "pytorch"
    named = load_pipeline(tj_pipeline({**TRAINJOB_REF, "container": "trainer"}))
    assert named.spec.workload.trainer == "trainer"
    with pytest.raises(ConfigError, match="MPIJob"):
        load_pipeline(tj_pipeline({"name": "llama", "kind": "MPIJob"}))


# -- injection ------------------------------------------------------------------------------


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_jobset_trainer_pods_get_the_sidecar() -> None:
    tj = load_pipeline(tj_pipeline(parallelism={"tensor": 2}))
    pt = load_pipeline(dp(name="other"))  # a PyTorchJob of the same name
    assert pipeline_for_pod(jobset_pod(), [pt, tj]) is tj
    assert pipeline_for_pod(pod(), [tj]) is None
    assert pipeline_for_pod(jobset_pod(replicated_job="model-initializer"), [tj]) is None
    out = mutate_pod(jobset_pod(nproc="4", nnodes="3"), tj, "img:1")
    (node,) = out["spec"]["containers"]
    env = env_of(node)
    # 3 nodes x 4 ranks / TP 2: DP 6; each pod's 4 ranks are 2 DP ranks of 2 readers
    assert (env["DATALANE_DP_READERS"], env["DATALANE_DP_SIZE"]) == ("2", "6")
    assert env["DATALANE_PIPELINE"] == "pretrain"
    (side,) = out["spec"]["initContainers"]
    assert env_of(side)["DATALANE_RANKS_PER_POD"] == "2"
    assert out["metadata"]["labels"]["datalane.io/pipeline"] == "pretrain"


class NoMorePipelines:
    """The API server's live list behind an index miss: the index was complete."""

    def __init__(self) -> None:
        self.created: list[str] = []

    async def list_pipelines(self, namespace: str) -> list[dict[str, Any]]:
        return []

    async def create_configmap(self, body: Any) -> bool:  # the injected recipe's ConfigMap
        self.created.append(body["metadata"]["name"])
        return True


def runtime() -> Runtime:
    return Runtime(kube=NoMorePipelines())  # type: ignore[arg-type]


def inject(body: dict[str, Any], index: dict[Any, Any]) -> str:
    patch = kopf.Patch()
    try:
        asyncio.run(handlers.inject_sidecar(body=kopf.Body(copy.deepcopy(body)), patch=patch,
                                            warnings=[], pipelines=index,
                                            memo=kopf.Memo(runtime=runtime())))
    except kopf.AdmissionError as e:
        return str(e)
    return f"injected ({len(patch.fns)} changes)"


def test_pod_webhook_injects_a_train_jobs_trainer_only() -> None:
    index = {("ml", "llama"): [tj_pipeline()]}
    assert inject(jobset_pod(), index) == "injected (1 changes)"
    assert inject(jobset_pod(replicated_job="dataset-initializer",
                             container="dataset-initializer"), index) == "injected (0 changes)"
    # a PyTorchJob called llama is not the TrainJob llama
    assert inject(pod(), index) == "injected (0 changes)"


def validate_trainjob(new: dict[str, Any], old: dict[str, Any] | None,
                      index: dict[Any, Any]) -> str:
    warnings: list[str] = []
    try:
        asyncio.run(handlers.validate_trainjob(body=kopf.Body(new), warnings=warnings,
                                               memo=kopf.Memo(runtime=runtime()),
                                               pipelines=index, old=old))
    except kopf.AdmissionError as e:
        return str(e)
    return "allowed" + "".join(f"; {w}" for w in warnings)


def test_train_job_webhook_guards_num_nodes() -> None:
    index = {("ml", "llama"): [tj_pipeline()]}
    assert validate_trainjob(trainjob(nodes=9), trainjob(nodes=4), index) == (
        "spec.trainer.numNodes 9: 8 lanes cannot be split over 9 nodes; use 1 to 8 "
        "(DataPipeline pretrain)")
    assert validate_trainjob(trainjob(nodes=8), trainjob(nodes=4), index) == "allowed"
    assert validate_trainjob(trainjob(nodes=9), None, index).startswith("spec.trainer.numNodes")
    # a pipeline naming a PyTorchJob llama does not guard the TrainJob llama
    assert validate_trainjob(trainjob(nodes=9), None, {("ml", "llama"): [dp()]}) == "allowed"


def test_pipeline_webhook_checks_the_running_train_job() -> None:
    warnings: list[str] = []
    with pytest.raises(kopf.AdmissionError) as e:
        asyncio.run(handlers.validate_pipeline(
            body=kopf.Body(tj_pipeline()), warnings=warnings, memo=kopf.Memo(runtime=runtime()),
            pipelines={}, jobs={}, trainjobs={("ml", "llama"): [trainjob(nodes=16)]}, old=None))
    assert str(e.value) == ("spec.lanes 8 does not fit TrainJob llama as it runs now: 8 lanes "
                            "cannot be split over 16 nodes; use 1 to 8")


# -- status ---------------------------------------------------------------------------------


def test_status_of_a_train_job() -> None:
    p = load_pipeline(tj_pipeline())
    pods = []
    for i in range(4):
        body = mutate_pod(jobset_pod(f"llama-node-0-{i}", index=i, nproc="2"), p, "img:1")
        body["status"] = {"phase": "Running",
                          "conditions": [{"type": "Ready", "status": "True"}]}
        pods.append(body)
    s = decide(p, trainjob(nodes=4, nproc="2"), pods, None, None, T0).status
    assert (s["pods"], s["readyPods"], s["ranksPerPod"], s["ranks"], s["worldSize"],
            s["lanesPerRank"]) == (4, 4, 2, 8, 8, 1)
    assert s["phase"] == "Running"
    done = trainjob(nodes=4, nproc="2")
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert decide(p, done, pods, None, None, T0).status["phase"] == "Succeeded"

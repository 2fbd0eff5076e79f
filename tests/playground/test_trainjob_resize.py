"""A TrainJob resized under Kubeflow Trainer v2's and JobSet's own controllers, its pods really
running: ``python -m playground up --trainer-v2`` (docs/playground.md#trainjob).

The operator is installed as the README's cluster section does it (its ``helm install`` and
``kubectl label namespace`` lines, verbatim). Then examples/pretrain.yaml's pipeline runs as a
TrainJob: the same Secret, trainer script (ConfigMap), recipe and lanes, the DataPipeline
naming the TrainJob ``llm``; the PyTorchJob's pod template becomes a namespaced
TrainingRuntime (the image, the volumes, the fsGroup), the TrainJob sets the trainer's image,
command, env, 3 nodes of 1 process and a GPU each. Checked:

* Trainer v2 makes the JobSet, JobSet the indexed Job, and its 3 pods arrive with the sidecar
  injected (node ranks 0-2, ``PET_NNODES=3``) and train; the status commits a step;
* ``numNodes`` 9 is refused by the datalane guard, and the TrainJob keeps 3;
* ``numNodes`` 2 is admitted and the status says 2 nodes, while Trainer v2.0.0 leaves the
  running JobSet alone (its Job still runs 3 pods: it updates a JobSet only when suspended);
* the restart at the new size (``kubectl delete jobset llm --cascade=foreground``, as a
  TrainJob's elastic restart would): Trainer v2 makes the JobSet again from the TrainJob, with
  2 nodes; both pods resume at one committed step no older than the status's
  ``lastCommittedStep`` before the resize, with 4 lanes each, and every global batch, before and
  after, equals an uninterrupted 3-node run of the recipe over the playground's corpus.

Several minutes (a fresh playground, the controllers, two generations of pods in podman).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
import yaml
from datalane_operator.names import (
    JOB_COMPLETION_INDEX,
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    SIDECAR_CONTAINER,
    TRAINJOB_TRAINER,
)

from playground.__main__ import FOLDER
from tests.cluster.util import eventually

from .session import Shell, running_playground
from .trainers import check_resumed, console_block, example, pod_log, records, wait_for_steps

pytestmark = [pytest.mark.cluster, pytest.mark.containers, pytest.mark.slow,
              pytest.mark.trainer_v2]
JOB, PIPELINE, RUNTIME = "llm", "pretrain-llm", "playground-torch"
NODES, RESIZED = 3, 2
AFTER = 8  # steps the resumed trainers read before the comparison
SELECTOR = f"{JOBSET_NAME_LABEL}={JOB},{JOBSET_REPLICATED_JOB_LABEL}={TRAINJOB_TRAINER}"
TRAINER = "trainer.kubeflow.org/v1alpha1"


def manifests() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(what the TrainJob needs, the TrainJob), from examples/pretrain.yaml."""
    ex = copy.deepcopy(example())
    pipeline = ex["DataPipeline"]
    pipeline["metadata"] = {"name": PIPELINE}
    pipeline["spec"]["workload"] = {"kind": "TrainJob", "name": JOB}
    pipeline["spec"]["checkpoint"]["uri"] = f"s3://playground/checkpoints/{PIPELINE}"
    pod = ex["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (trainer,) = pod["containers"]
    volumes = [v if v["name"] != "checkpoints" else  # the trainers' markers, a folder of its own
               {"name": v["name"], "hostPath": {"path": str(FOLDER / JOB),
                                                "type": "DirectoryOrCreate"}}
               for v in pod["volumes"]]
    runtime = {
        "apiVersion": TRAINER, "kind": "TrainingRuntime", "metadata": {"name": RUNTIME},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
                 "template": {"spec": {"replicatedJobs": [{"name": TRAINJOB_TRAINER, "template": {
                     "metadata": {"labels": {
                         "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                     "spec": {"template": {"spec": {
                         "restartPolicy": "OnFailure",
                         "securityContext": pod["securityContext"], "volumes": volumes,
                         "containers": [{"name": TRAINJOB_TRAINER, "image": trainer["image"],
                                         "volumeMounts": trainer["volumeMounts"]}]}}}}}]}}}}
    # NODE_RANK, train.py's rank: the indexed Job's completion index (Trainer v2's PET_NODE_RANK)
    rank = f"metadata.annotations['{JOB_COMPLETION_INDEX}']"
    env = [e for e in trainer["env"] if e["name"] != "NODE_RANK"] + [
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": rank}}}]
    job = {"apiVersion": TRAINER, "kind": "TrainJob", "metadata": {"name": JOB},
           "spec": {"runtimeRef": {"name": RUNTIME, "kind": "TrainingRuntime"},
                    "trainer": {"image": trainer["image"], "command": trainer["command"],
                                "env": env, "numNodes": NODES, "numProcPerNode": 1,
                                "resourcesPerNode": trainer["resources"]}}}
    return [ex["Secret"], ex["ConfigMap"], pipeline, runtime], job


def trainer_pods(sh: Shell) -> dict[str, dict[str, Any]]:
    """The TrainJob's trainer pods by name (those not being deleted)."""
    items = json.loads(sh.ok(f"kubectl get pods -l {SELECTOR} -o json"))["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def running(sh: Shell, count: int, not_of: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """``count`` running trainer pods, none of the uids ``not_of``, or {}."""
    pods = {n: p for n, p in trainer_pods(sh).items() if p["metadata"]["uid"] not in not_of}
    ok = len(pods) == count and all(p["status"].get("phase") == "Running"
                                    for p in pods.values())
    return pods if ok else {}


def check_pods(pods: dict[str, dict[str, Any]], nodes: int) -> None:
    """Injected, ranks 0 to nodes-1, and Trainer v2's world on the trainer container."""
    ranks = []
    for p in pods.values():
        inits = {c["name"]: c for c in p["spec"].get("initContainers") or []}
        assert inits[SIDECAR_CONTAINER]["restartPolicy"] == "Always", p["metadata"]["name"]
        (node,) = p["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in node["env"]}
        assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == (str(nodes), "1")
        assert env["DATALANE_PIPELINE"] == PIPELINE
        ranks.append(int(p["metadata"]["annotations"][JOB_COMPLETION_INDEX]))
    assert sorted(ranks) == list(range(nodes))


def test_trainjob_resize_resumes_with_the_same_global_batches(tmp_path: Path) -> None:
    install = [c for c in console_block() if c.startswith(("helm install", "kubectl label"))]
    assert len(install) == 2, install
    needs, job = manifests()
    (tmp_path / "needs.yaml").write_text(yaml.safe_dump_all(needs, sort_keys=False))
    (tmp_path / "trainjob.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    with running_playground("--trainer-v2") as (_, sh):
        for cmd in install:
            sh.ok(cmd)
        sh.ok(f"kubectl apply --server-side -f {tmp_path / 'needs.yaml'}")
        eventually(lambda: sh.status(PIPELINE, "phase"), timeout=120, interval=1,
                   what="the operator to take up the DataPipeline")
        sh.ok(f"kubectl apply --server-side -f {tmp_path / 'trainjob.yaml'}")

        # Trainer v2 -> JobSet -> an indexed Job of 3 pods, injected, training
        first = eventually(lambda: running(sh, NODES), timeout=600, interval=2,
                           what=f"{NODES} running pods of TrainJob {JOB}")
        check_pods(first, NODES)
        sh.ok(f"kubectl wait dp {PIPELINE} --for=jsonpath='{{.status.lastCommittedStep}}' "
              "--timeout=10m", timeout=660)

        # the guard: 9 nodes for 8 lanes is refused, the TrainJob keeps 3
        nine = sh(f"kubectl patch trainjob {JOB} --type=merge "
                  "-p '{\"spec\":{\"trainer\":{\"numNodes\":9}}}'")
        assert nine.returncode != 0
        assert (f"spec.trainer.numNodes 9: 8 lanes cannot be split over 9 nodes; use 1 to 8 "
                f"(DataPipeline {PIPELINE})") in " ".join(nine.stderr.split()), nine.stderr
        assert sh.ok(f"kubectl get trainjob {JOB} "
                     "-o jsonpath='{.spec.trainer.numNodes}'") == str(NODES)

        # the resize: admitted; the status follows, Trainer v2 leaves the running JobSet alone
        committed_before = int(sh.status(PIPELINE, "lastCommittedStep"))
        sh.ok(f"kubectl patch trainjob {JOB} --type=merge "
              f"-p '{{\"spec\":{{\"trainer\":{{\"numNodes\":{RESIZED}}}}}}}'")
        eventually(lambda: sh.status(PIPELINE, "worldSize") == str(RESIZED), timeout=120,
                   interval=1, what=f"the DataPipeline status to say {RESIZED} nodes")
        assert sh.ok(f"kubectl get jobset {JOB} -o jsonpath="
                     "'{.spec.replicatedJobs[0].template.spec.parallelism}'") == str(NODES)
        assert set(trainer_pods(sh)) == set(first)

        # the restart at the new size: Trainer v2 makes the JobSet again, of 2 nodes
        sh.ok(f"kubectl delete jobset {JOB} --cascade=foreground --timeout=10m", timeout=660)
        old = {p["metadata"]["uid"] for p in first.values()}
        second = eventually(lambda: running(sh, RESIZED, not_of=old), timeout=600, interval=2,
                            what=f"{RESIZED} running pods of the new JobSet {JOB}")
        check_pods(second, RESIZED)
        assert (sh.status(PIPELINE, "worldSize"), sh.status(PIPELINE, "lanesPerRank")) == \
            (str(RESIZED), "4")

        # resumed from the last committed step, the same global batches
        before = [records(pod_log("default", name, TRAINJOB_TRAINER)) for name in first]
        runs = wait_for_steps([pod_log("default", name, TRAINJOB_TRAINER) for name in second],
                              AFTER, timeout=600)
        step = check_resumed(before, runs, world=RESIZED, committed_before=committed_before,
                             lanes_per_rank=[4, 4], reference_world=NODES, after_steps=AFTER)
        print(f"TrainJob {JOB}: {NODES} -> {RESIZED} nodes; lastCommittedStep {committed_before} "
              f"before the resize, resumed at step {step}")  # shown by pytest -rA

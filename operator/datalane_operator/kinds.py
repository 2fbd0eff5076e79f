"""The workload registry: each kind of training job a DataPipeline can name, and how to read it.

``spec.workload.kind`` picks a :class:`WorkloadKind`, which says

* where the job lives in the API (group, version, plural);
* which pods are its trainer pods: the pod label naming the job, and the further labels
  only the trainer's pods carry (a TrainJob's JobSet also runs initializer pods, which get
  no sidecar);
* its default trainer container, its world (:mod:`datalane_operator.workload`), the field a
  resize edits (named in the scale guard's refusals), a pod's node rank, and the condition
  that says the job finished.

Kinds:

* ``PyTorchJob`` (kubeflow.org/v1, Kubeflow training-operator): pods labelled
  ``training.kubeflow.org/job-name``; the ``Worker`` replicas scale (``pytorchjobs/scale``).
* ``TrainJob`` (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2 on JobSet): the JobSet is
  named after the TrainJob, so its pods carry ``jobset.sigs.k8s.io/jobset-name: <job>``; the
  trainer's are those of the replicated job ``node`` (Trainer v2's ``constants.Node``, also the
  trainer container's name), an indexed Job whose completion index is the node rank
  (``PET_NODE_RANK``); ``spec.trainer.numNodes`` scales it (no scale subresource: a resize is
  an UPDATE of the TrainJob, which the workload webhook guards). Trainer v2 sets
  ``PET_NNODES`` and ``PET_NPROC_PER_NODE`` on that container as the training-operator does,
  so the pod mutation reads both kinds' pods alike.

Pure data and functions over plain dicts. Callers: the webhooks, the kopf registrations, the
API client and the reconciler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import ConfigError
from datalane_operator.names import (
    JOB_COMPLETION_INDEX,
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    PYTORCHJOB_GROUP,
    PYTORCHJOB_PLURAL,
    PYTORCHJOB_VERSION,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    TRAINJOB_GROUP,
    TRAINJOB_PLURAL,
    TRAINJOB_TRAINER,
    TRAINJOB_VERSION,
)
from datalane_operator.pipeline import TRAINER_CONTAINERS, Parallelism
from datalane_operator.workload import Topology, topology_of, trainjob_topology_of

__all__ = ["KINDS", "PYTORCHJOB", "TRAINJOB", "WorkloadKind", "kind_named", "trainer_pod_of"]

TRAINJOB_KIND = "TrainJob"
TopologyOf = Callable[[Mapping[str, Any], str, "Parallelism | None"], Topology]


@dataclass(frozen=True)
class WorkloadKind:
    """One kind of training job (see the module doc)."""

    kind: str
    group: str
    version: str
    plural: str
    job_label: str
    """The pod label whose value is the job's name."""
    trainer_labels: Mapping[str, str]
    """Further labels every trainer pod of the job carries (and no other pod of it)."""
    container: str
    """The trainer container's name unless ``spec.workload.container`` says otherwise."""
    scale_field: str | None
    """The field a resize edits, named with its value in the guard's refusals (None: a
    PyTorchJob's, whose ``kubectl scale`` sets the Worker replicas, keep their words)."""
    done: Mapping[str, str]
    """Condition types (status True) that end the job -> the outcome: Succeeded or Failed."""
    topology: TopologyOf

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def selector(self, job: str) -> str:
        """The label selector of the job's trainer pods."""
        return ",".join(f"{k}={v}" for k, v in {self.job_label: job,
                                                 **self.trainer_labels}.items())

    def job_of_pod(self, pod: Mapping[str, Any]) -> str | None:
        """The name of the job whose trainer ``pod`` is, or None (another kind's pod, or a
        pod of the job that is not the trainer's, such as a TrainJob's initializers)."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job = labels.get(self.job_label)
        if not job or any(labels.get(k) != v for k, v in self.trainer_labels.items()):
            return None
        return str(job)

    def node_rank(self, pod: Mapping[str, Any], job: Mapping[str, Any]) -> int | None:
        """The pod's node rank (torchrun's ``--node-rank``: its ranks are node_rank x nproc
        onwards), from the labels the job's controller sets; None if they do not say."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if self.kind == TRAINJOB_KIND:
            raw = labels.get(JOB_COMPLETION_INDEX) or (meta.get("annotations") or {}).get(
                JOB_COMPLETION_INDEX)
            return int(raw) if isinstance(raw, str) and raw.isdigit() else None
        rtype, index = labels.get(REPLICA_TYPE_LABEL), labels.get(REPLICA_INDEX_LABEL)
        if not isinstance(index, str) or not index.isdigit() or not rtype:
            return None
        if rtype.lower() == "master":
            return int(index)
        # Workers follow the Master (the training-operator's RANK: index + 1 with a Master)
        topo = self.topology(job, self.container, None)
        return int(index) + topo.others


PYTORCHJOB = WorkloadKind(
    kind="PyTorchJob", group=PYTORCHJOB_GROUP, version=PYTORCHJOB_VERSION,
    plural=PYTORCHJOB_PLURAL, job_label=JOB_NAME_LABEL, trainer_labels={},
    container=TRAINER_CONTAINERS["PyTorchJob"], scale_field=None,
    done={"Succeeded": "Succeeded", "Failed": "Failed"}, topology=topology_of)

TRAINJOB = WorkloadKind(
    kind=TRAINJOB_KIND, group=TRAINJOB_GROUP, version=TRAINJOB_VERSION, plural=TRAINJOB_PLURAL,
    job_label=JOBSET_NAME_LABEL, trainer_labels={JOBSET_REPLICATED_JOB_LABEL: TRAINJOB_TRAINER},
    container=TRAINJOB_TRAINER, scale_field="spec.trainer.numNodes",
    done={"Complete": "Succeeded", "Failed": "Failed"}, topology=trainjob_topology_of)

KINDS: Mapping[str, WorkloadKind] = {k.kind: k for k in (PYTORCHJOB, TRAINJOB)}
"""Every kind, by ``spec.workload.kind``."""


def kind_named(kind: str | None) -> WorkloadKind:
    """The kind ``spec.workload.kind`` names (absent: PyTorchJob, the CRD's default)."""
    found = KINDS.get(kind or PYTORCHJOB.kind)
    if found is None:
        raise ConfigError(f"spec.workload.kind {kind!r} is not one of {', '.join(KINDS)}")
    return found


def trainer_pod_of(pod: Mapping[str, Any]) -> tuple[WorkloadKind, str] | None:
    """(kind, job name) of the job whose trainer ``pod`` is, or None for any other pod."""
    for kind in KINDS.values():
        job = kind.job_of_pod(pod)
        if job is not None:
            return kind, job
    return None

"""Reconcile decisions: a DataPipeline's status, rebuilt from the world, and its events.

:func:`decide` takes what the operator observed - the pipeline, its workload (or None), the
workload's pods, the last look at the checkpoint store - and the previous status, and returns
the whole new status plus the events that the change deserves. Nothing here talks to the API
server or to storage; :mod:`datalane_operator.handlers` gathers the inputs and applies the
result, so a restarted operator converges to the same status (kubebuilder's "status is
rebuilt from the world").

Conditions:

* ``Ready`` - the workload exists, its data-parallel world size divides the lanes, every pod
  carries the sidecar and is ready, and the checkpoint store can be listed;
* ``Degraded`` - something needs a human: ``WorldSizeMismatch``, ``ParallelismMismatch``
  (the ranks do not fit ``spec.parallelism``), ``RanksPerPodUnknown``, ``SidecarMissing``
  (pods created before the pipeline), ``StorageUnavailable``, ``StoreAccessDenied`` (the
  cluster policy or the Secret does not let the operator act on the store: it was not
  touched), ``InvalidSpec``.

``status.worldSize`` is the data-parallel world size, ranks / (TP x PP x CP); ``ranks`` and
``ranksPerPod`` count torchrun's processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import ConfigError
from datalane.store.layout import format_steps
from datalane_operator.inject import is_injected
from datalane_operator.names import recipe_configmap_name
from datalane_operator.pipeline import Parallelism, Pipeline
from datalane_operator.storage import Listing
from datalane_operator.workload import Topology, check_workers, topology_of

__all__ = ["MAX_LISTED_CHECKPOINTS", "Decision", "Event", "PodCounts", "decide", "decide_invalid",
           "count_pods"]

MAX_LISTED_CHECKPOINTS = 10
"""``status.checkpoints`` holds at most this many (the newest) committed steps."""
_MAX_NAMED_PODS = 3


@dataclass(frozen=True)
class Event:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)

    def changed(self, previous: Mapping[str, Any] | None) -> bool:
        return dict(previous or {}) != self.status


@dataclass(frozen=True)
class PodCounts:
    """The workload's live pods: how many, how many ready, which lack the sidecar."""

    total: int = 0
    ready: int = 0
    without_sidecar: tuple[str, ...] = ()


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def count_pods(pods: Sequence[Mapping[str, Any]]) -> PodCounts:
    total = ready = 0
    missing: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        total += 1
        injected = is_injected(pod)
        if not injected:
            missing.append(str(meta.get("name", "")))
        elif _pod_ready(pod):
            ready += 1
    return PodCounts(total, ready, tuple(sorted(missing)))


def _job_outcome(job: Mapping[str, Any]) -> str | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Succeeded", "Failed"):
            return str(cond["type"])
    return None


def _condition(previous: Mapping[str, Any], ctype: str, status: bool, reason: str,
               message: str, generation: int, now: str) -> dict[str, Any]:
    text = "True" if status else "False"
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == ctype), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == text else None
    return {"type": ctype, "status": text, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since or now}


def _names(pods: Sequence[str]) -> str:
    shown = ", ".join(pods[:_MAX_NAMED_PODS])
    more = len(pods) - _MAX_NAMED_PODS
    return shown + (f" and {more} more" if more > 0 else "")


def decide(pipeline: Pipeline, workload: Mapping[str, Any] | None,
           pods: Sequence[Mapping[str, Any]], listing: Listing | None,
           previous: Mapping[str, Any] | None, now: str) -> Decision:
    """The pipeline's new status and the events for the change from ``previous``."""
    prev = dict(previous or {})
    spec = pipeline.spec
    lanes = spec.lanes
    gen = pipeline.generation
    problems: list[tuple[str, str]] = []  # (reason, message) of Degraded
    status: dict[str, Any] = {"observedGeneration": gen,
                              "recipeConfigMap": recipe_configmap_name(pipeline.name)}
    topo: Topology | None = None
    counts = count_pods(pods)
    outcome = None
    if workload is not None:
        topo = topology_of(workload, spec.workload.container, spec.parallelism)
        outcome = _job_outcome(workload)
        status["pods"] = topo.pods
        status["readyPods"] = counts.ready
        if topo.nproc is None:
            problems.append(("RanksPerPodUnknown",
                             f"{spec.workload.kind} {spec.workload.name}: {topo.nproc_source}"))
        else:
            dp = topo.dp_size
            status["ranksPerPod"] = topo.nproc
            status["ranks"] = topo.ranks
            status["readersPerDataRank"] = spec.parallelism.readers
            status["worldSize"] = dp  # None (dropped) when the ranks are no whole replicas
            try:
                check_workers(lanes, topo)
                if dp:
                    status["lanesPerRank"] = lanes // dp
            except ConfigError as e:
                fits = topo.pod_problem() is None and topo.mesh_problem() is None
                problems.append(("WorldSizeMismatch" if fits else "ParallelismMismatch",
                                 str(e)))
        if counts.without_sidecar and outcome is None:
            problems.append(("SidecarMissing",
                             f"{len(counts.without_sidecar)} pods of {spec.workload.name} have "
                             f"no datalane sidecar (created before the DataPipeline or with "
                             f"the webhook down): {_names(counts.without_sidecar)}; delete them "
                             f"so that they are recreated"))
    # checkpoints: from this look at the store, else what the last look found
    if listing is not None and listing.ok:
        committed = listing.committed
        status["lastCommittedStep"] = committed[-1] if committed else None
        status["checkpoints"] = committed[-MAX_LISTED_CHECKPOINTS:]
    else:
        status["lastCommittedStep"] = prev.get("lastCommittedStep")
        status["checkpoints"] = list(prev.get("checkpoints") or [])
        if listing is not None and listing.denied:
            problems.append(("StoreAccessDenied", listing.error))
        elif listing is not None:
            problems.append(("StorageUnavailable",
                             f"cannot list {listing.uri}: {listing.error}"))
    status = {k: v for k, v in status.items() if v is not None}

    # phase and conditions
    if workload is None:
        phase = "Pending"
        ready = (False, "WorkloadNotFound",
                 f"{spec.workload.kind} {spec.workload.name} does not exist (yet)")
    elif outcome is not None:
        phase = outcome
        ready = (False, f"Workload{outcome}", f"{spec.workload.kind} {spec.workload.name} "
                 f"{outcome.lower()}")
    elif problems:
        phase = "Degraded"
        ready = (False, problems[0][0], problems[0][1])
    elif topo is not None and counts.ready >= topo.pods > 0:
        phase = "Running"
        ready = (True, "AllPodsReady", f"{counts.ready} pods ready; world size "
                 f"{status.get('worldSize')}, {status.get('lanesPerRank')} lanes per rank")
    else:
        phase = "Starting"
        want = topo.pods if topo is not None else 0
        ready = (False, "PodsNotReady", f"{counts.ready} of {want} pods ready")
    if problems:
        degraded = (True, problems[0][0], "; ".join(m for _, m in problems))
    else:
        degraded = (False, "AsExpected", "")
    status["phase"] = phase
    status["conditions"] = [
        _condition(prev, "Ready", *ready, gen, now),
        _condition(prev, "Degraded", *degraded, gen, now),
    ]
    return Decision(status, _events(prev, status, listing, spec.checkpoint.keep, spec.workload,
                                    spec.parallelism))


def decide_invalid(pipeline_name: str, generation: int, error: str,
                   previous: Mapping[str, Any] | None, now: str) -> Decision:
    """Status of a DataPipeline whose spec does not load (stored while the webhook was off)."""
    prev = dict(previous or {})
    status = {"observedGeneration": generation, "phase": "Degraded",
              "recipeConfigMap": recipe_configmap_name(pipeline_name),
              "conditions": [
                  _condition(prev, "Ready", False, "InvalidSpec", error, generation, now),
                  _condition(prev, "Degraded", True, "InvalidSpec", error, generation, now)]}
    for key in ("lastCommittedStep", "checkpoints"):
        if key in prev:
            status[key] = prev[key]
    return Decision(status, _events(prev, status, None, 0, None))


def _cond(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


def _events(prev: Mapping[str, Any], new: Mapping[str, Any], listing: Listing | None,
            keep: int, workload: Any, parallelism: Parallelism | None = None) -> list[Event]:
    out: list[Event] = []
    old_w, new_w = prev.get("worldSize"), new.get("worldSize")
    if new_w is not None and old_w != new_w:
        par = (parallelism or Parallelism()).describe()
        world = "data-parallel world size" if par else "world size"
        mesh = f"{par} -> DP {new_w}, " if par else ""
        desc = (f"{new.get('pods')} pods x {new.get('ranksPerPod')} ranks, {mesh}"
                f"{new.get('lanesPerRank', '?')} lanes per rank")
        if old_w is None:
            out.append(Event("Normal", "WorkloadObserved",
                             f"{workload.kind} {workload.name}: {world} {new_w} ({desc})"))
        else:
            out.append(Event("Normal", "Rescaled", f"{world} {old_w} -> {new_w} ({desc})"))
    step = new.get("lastCommittedStep")
    if step is not None and step != prev.get("lastCommittedStep"):
        out.append(Event("Normal", "Checkpointed", f"step {step} is the last committed "
                         f"checkpoint"))
    if listing is not None and listing.deleted:
        out.append(Event("Normal", "CheckpointsCollected",
                         f"deleted steps {format_steps(listing.deleted)}; keeping the newest "
                         f"{keep} committed"))
    was, now = _cond(prev, "Degraded"), _cond(new, "Degraded")
    if now.get("status") == "True" and (was.get("status") != "True"
                                        or was.get("reason") != now.get("reason")):
        out.append(Event("Warning", str(now.get("reason")), str(now.get("message"))))
    if was.get("status") == "True" and now.get("status") == "False":
        out.append(Event("Normal", "Recovered", f"no longer degraded ({was.get('reason')})"))
    return out

"""Reconcile decisions: a DataPipeline's status, rebuilt from the world, and its events.

:func:`decide` takes what the operator observed - the pipeline, its workload (or None), the
workload's pods, the last look at the checkpoint store - and the previous status, and returns
the whole new status plus the events that the change deserves. Nothing here talks to the API
server or to storage; :mod:`datalane_operator.reconciler` gathers the inputs and applies the
result, so a restarted operator converges to the same status (kubebuilder's "status is
rebuilt from the world").

Conditions:

* ``Ready`` - the workload exists, its data-parallel world size is at most the lanes, every pod
  carries the sidecar and is ready, and the checkpoint store can be listed;
* ``PhaseRolled`` - only after an edit of ``spec.recipe``: whether every pod serves the
  current recipe, or which pods the operator restarts at which checkpoint
  (:mod:`~datalane_operator.rollout`; the decision names the pods to delete);
* ``Degraded`` - something needs a human: ``SidecarFailed`` (a sidecar cannot start or keeps
  exiting: a glob that matches nothing, missing credentials, an unreachable store, a Secret
  or image that does not exist; the message is the sidecar's own, from its termination
  message in the pod status, or the kubelet's), ``WorldSizeMismatch``, ``ParallelismMismatch``
  (the ranks do not fit ``spec.parallelism``), ``RanksPerPodUnknown``, ``SidecarMissing``
  (pods created before the pipeline), ``StorageUnavailable``, ``StoreAccessDenied`` (the
  cluster policy or the Secret does not let the operator act on the store: it was not
  touched), ``CheckpointPastPhase`` (a checkpoint past an edited phase's start was committed
  under the old recipe), ``InvalidSpec``.

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
from datalane_operator.kinds import WorkloadKind, kind_named
from datalane_operator.names import (
    NAMESPACE_OPT_IN_LABEL,
    NAMESPACE_OPT_IN_VALUE,
    SIDECAR_CONTAINER,
)
from datalane_operator.pipeline import Parallelism, Pipeline
from datalane_operator.recipemap import configmap_name
from datalane_operator.rollout import CONDITION as ROLLED
from datalane_operator.rollout import Roll, plan_roll, stamp_of
from datalane_operator.storage import Listing
from datalane_operator.workload import Topology, check_workers, lanes_per_rank

__all__ = ["MAX_LISTED_CHECKPOINTS", "Decision", "Event", "PodCounts", "SidecarFailure", "decide",
           "decide_invalid", "count_pods", "sidecar_failures"]

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
    restart: tuple[str, ...] = ()
    """Pods to delete (the workload's controller recreates them): they serve an older recipe
    and the job has just committed the checkpoint they resume from (:mod:`~datalane_operator.
    rollout`)."""

    def changed(self, previous: Mapping[str, Any] | None) -> bool:
        return dict(previous or {}) != self.status

    def restart_refused(self, why: str) -> Decision:
        """This decision when the pods it restarts may not be deleted (RBAC): ``PhaseRolled``
        False with reason ``RestartForbidden`` and ``why``, a Warning event, no restart."""
        conditions = [dict(c, reason="RestartForbidden", message=f"{c['message']}: {why}")
                      if c.get("type") == ROLLED else c for c in self.status["conditions"]]
        events = [e for e in self.events if e.reason != "RestartingPods"]
        return Decision({**self.status, "conditions": conditions},
                        [*events, Event("Warning", "RestartForbidden", why)])


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


# Waiting reasons of a container that will not start without a change (the kubelet's words).
_STUCK = ("CreateContainerConfigError", "CreateContainerError", "ErrImagePull",
          "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RunContainerError")
MAX_FAILURE_MESSAGE = 4096
"""A kubelet keeps at most 4096 bytes of a termination message; so does the condition."""


@dataclass(frozen=True)
class SidecarFailure:
    """Why one pod's sidecar is not serving: its last exit, or what keeps it from starting."""

    pod: str
    what: str  # "exited with code 2", "CreateContainerConfigError"
    message: str

    def describe(self) -> str:
        text = f"the sidecar of pod {self.pod} {self.what}"
        return f"{text}: {self.message}" if self.message else text


def _sidecar_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    status = pod.get("status") or {}
    for c in [*(status.get("initContainerStatuses") or []),
              *(status.get("containerStatuses") or [])]:
        if c.get("name") == SIDECAR_CONTAINER:
            return c  # type: ignore[no-any-return]
    return None


def sidecar_failure(pod: Mapping[str, Any]) -> SidecarFailure | None:
    """The sidecar's failure in ``pod``, from the container status the kubelet reports.

    A sidecar that is ready is fine, whatever its past exits; one that is not ready and whose
    last run ended with a non-zero code (``state`` or ``lastState.terminated``: a native
    sidecar in ``CrashLoopBackOff`` shows the exit in ``lastState``), or that waits for
    something only a human can fix (a missing Secret, an image that cannot be pulled), has
    failed. The message is the container's termination message (the sidecar writes its fatal
    error there) or the kubelet's waiting message.
    """
    cs = _sidecar_status(pod)
    if cs is None or cs.get("ready"):
        return None
    name = str((pod.get("metadata") or {}).get("name", ""))
    state = cs.get("state") or {}
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in _STUCK:
        return SidecarFailure(name, str(waiting["reason"]), _clip(waiting.get("message")))
    ended = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
    code = ended.get("exitCode")
    if not ended or code in (None, 0):
        return None
    what = f"exited with code {code}"
    if ended.get("reason") not in (None, "", "Error"):
        what += f" ({ended['reason']})"  # OOMKilled, ContainerCannotRun, ...
    return SidecarFailure(name, what, _clip(ended.get("message")))


def _clip(text: Any) -> str:
    out = str(text or "").strip()
    return out if len(out) <= MAX_FAILURE_MESSAGE else out[:MAX_FAILURE_MESSAGE - 3] + "..."


def sidecar_failures(pods: Sequence[Mapping[str, Any]]) -> list[SidecarFailure]:
    """:func:`sidecar_failure` of every live pod, by pod name."""
    out = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        failure = sidecar_failure(pod)
        if failure is not None:
            out.append(failure)
    return sorted(out, key=lambda f: f.pod)


def _failures_message(failures: Sequence[SidecarFailure]) -> str:
    """The first failure in full, then how many other pods fail and which (same cause or
    not: their messages are in ``kubectl describe pod``)."""
    text = failures[0].describe()
    others = [f.pod for f in failures[1:]]
    if others:
        text += f" (and the sidecars of {len(others)} more pods: {_names(others)})"
    return text


def _job_outcome(job: Mapping[str, Any], kind: WorkloadKind) -> str | None:
    """Succeeded or Failed once the job's controller says it ended (a TrainJob's Complete is
    Succeeded), else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in kind.done:
            return kind.done[str(cond["type"])]
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
                              "recipeConfigMap": configmap_name(pipeline)}
    topo: Topology | None = None
    counts = count_pods(pods)
    outcome = None
    if workload is not None:
        kind = kind_named(spec.workload.kind)
        topo = kind.topology(workload, spec.workload.trainer, spec.parallelism)
        outcome = _job_outcome(workload, kind)
        failures = sidecar_failures(pods) if outcome is None else []
        if failures:  # first: it carries the sidecar's own words, the likeliest root cause
            problems.append(("SidecarFailed", _failures_message(failures)))
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
                    status["lanesPerRank"] = lanes_per_rank(lanes, dp)  # 4, or "2-3"
            except ConfigError as e:
                fits = topo.pod_problem() is None and topo.mesh_problem() is None
                problems.append(("WorldSizeMismatch" if fits else "ParallelismMismatch",
                                 str(e)))
        if counts.without_sidecar and outcome is None:
            problems.append(("SidecarMissing",
                             f"{len(counts.without_sidecar)} pods of {spec.workload.name} have "
                             f"no datalane sidecar (created before the DataPipeline, or while "
                             f"the namespace lacked the label {NAMESPACE_OPT_IN_LABEL}="
                             f"{NAMESPACE_OPT_IN_VALUE}): {_names(counts.without_sidecar)}; "
                             f"delete them so that they are recreated"))
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
    roll = Roll()
    if workload is not None and outcome is None:
        looked = (listing is not None and listing.ok) or "checkpoints" in prev
        roll = plan_roll(stamp_of(pipeline.recipe), pods,
                         status["checkpoints"] if looked else None,
                         prev.get("lastCommittedStep"), _cond(prev, ROLLED))
        if roll.problem is not None:
            problems.append(roll.problem)
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
    if roll.condition is not None:
        status["conditions"].append(_condition(prev, ROLLED, *roll.condition, gen, now))
    events = _events(prev, status, listing, spec.checkpoint.keep, spec.workload,
                     spec.parallelism)
    if roll.restart:
        events.append(Event("Normal", "RestartingPods", roll.condition[2] if roll.condition
                            else ""))
    return Decision(status, events, roll.restart)


def decide_invalid(pipeline_name: str, generation: int, error: str,
                   previous: Mapping[str, Any] | None, now: str) -> Decision:
    """Status of a DataPipeline whose spec does not load (stored while the webhook was off);
    ``recipeConfigMap`` stays the last recipe's (an invalid spec has none)."""
    prev = dict(previous or {})
    status = {"observedGeneration": generation, "phase": "Degraded",
              "conditions": [
                  _condition(prev, "Ready", False, "InvalidSpec", error, generation, now),
                  _condition(prev, "Degraded", True, "InvalidSpec", error, generation, now)]}
    for key in ("lastCommittedStep", "checkpoints", "recipeConfigMap"):
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

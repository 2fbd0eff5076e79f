"""The admission webhooks' work, from kopf's arguments to a verdict, and the timed server.

Each function takes the :class:`~datalane_operator.runtime.Runtime` and what kopf hands the
handler (the object, the old object, the in-memory indexes of DataPipelines and of the jobs of each
kind, :mod:`datalane_operator.kinds`)
and raises :class:`kopf.AdmissionError` to refuse; the registrations in
:mod:`datalane_operator.handlers` call them. Lookups come from the indexes (no API call on the
hot path); an index miss for a training pod falls back to one live list, so a pod created in
the moment a pipeline appears is not missed. The pod webhook's one write: the ConfigMap of the
recipe it injects, created before the pod is admitted when it does not exist yet
(:mod:`datalane_operator.recipemap` says why), never on a dry run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import kopf

from datalane.spec.errors import ConfigError
from datalane_operator.admission import Verdict, review_pipeline, review_scale, review_workload
from datalane_operator.inject import mutate_pod
from datalane_operator.kinds import PYTORCHJOB, TRAINJOB, WorkloadKind, trainer_pod_of
from datalane_operator.names import NAMESPACE_OPT_IN_LABEL, NAMESPACE_OPT_IN_VALUE
from datalane_operator.pipeline import Parallelism, Pipeline, load_pipeline, parallelism_of
from datalane_operator.recipemap import WRITTEN_TTL_S, configmap_body, configmap_name
from datalane_operator.reconciler import store_progress
from datalane_operator.stats import timed

if TYPE_CHECKING:
    from datalane_operator.runtime import Key, Runtime

__all__ = ["TimedWebhookServer", "inject_sidecar", "refuse_namespace", "validate_pipeline",
           "validate_scale", "validate_workload"]

Index = Any  # kopf.Index[Key, Any], or a plain mapping of lists in tests


class TimedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server with :func:`~datalane_operator.stats.timed` reviews, reported to
    ``runtime.reviewed``."""

    def __init__(self, *, runtime: Runtime, **kw: Any) -> None:
        super().__init__(**kw)
        self.runtime = runtime

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        reviews = timed(fn, self.runtime.clock, self.runtime.reviewed)
        async for client_config in super().__call__(reviews):
            yield client_config


def _first(index: Index, key: Key) -> Any:
    try:
        return next(iter(index[key]), None)
    except KeyError:
        return None


def _parallelism(found: Mapping[str, Any]) -> Parallelism:
    """The ``spec.parallelism`` of an indexed DataPipeline; an invalid one (stored while the
    webhook was off) refuses the change, since the data-parallel world cannot be known."""
    try:
        return parallelism_of(found.get("spec") or {})
    except ConfigError as e:
        raise kopf.AdmissionError(f"DataPipeline {found['metadata'].get('name')} is invalid, "
                                  f"so the world size cannot be checked: {e}", code=422) from None


def _deny(verdict: Verdict, warnings: list[str]) -> None:
    warnings.extend(verdict.warnings)
    if not verdict.allowed:
        raise kopf.AdmissionError(verdict.message, code=422)


def _names_job(item: Mapping[str, Any], kind: WorkloadKind, job: str) -> bool:
    workload = (item.get("spec") or {}).get("workload") or {}
    return bool(workload.get("name") == job
                and (workload.get("kind") or PYTORCHJOB.kind) == kind.kind)


async def _pipeline_for(rt: Runtime, namespace: str, job: str, pipelines: Index,
                        kind: WorkloadKind = PYTORCHJOB) -> dict[str, Any] | None:
    """The DataPipeline referencing ``job`` of ``kind``: from the index, else from one live
    list."""
    try:
        indexed = list(pipelines[(namespace, job)])
    except KeyError:
        indexed = []
    found = next((item for item in indexed if _names_job(item, kind, job)), None)
    if found is not None:
        return dict(found)
    for item in await rt.k().list_pipelines(namespace):
        if _names_job(item, kind, job):
            return dict(item)
    return None


def _jobs_of(found: Mapping[str, Any], jobs: Mapping[str, Index]) -> Index:
    """The index of the jobs of the kind that pipeline ``found`` names (empty if unknown)."""
    kind = ((found.get("spec") or {}).get("workload") or {}).get("kind") or PYTORCHJOB.kind
    return jobs.get(str(kind), {})


async def validate_pipeline(rt: Runtime, body: kopf.Body, old: Any, pipelines: Index,
                            jobs: Mapping[str, Index], warnings: list[str]) -> None:
    """``jobs``: the index of each kind's jobs, by kind."""
    namespace = body.metadata.namespace or ""
    if not rt.config.watches(namespace):
        return  # not this operator's namespace (the chart's namespaceSelector keeps it away)
    new = dict(body)
    workload = ((new.get("spec") or {}).get("workload") or {}).get("name", "")
    others = [(str(v["metadata"].get("name")), workload)
              for v in pipelines.get((namespace, workload), [])]
    job = _first(_jobs_of(new, jobs), (namespace, workload))
    progress = None
    if old and (old.get("spec") or {}).get("recipe") != (new.get("spec") or {}).get("recipe"):
        progress = await store_progress(rt, dict(old))  # the store, never the status
    _deny(review_pipeline(new, dict(old) if old else None, others=others, workload=job,
                          policy=rt.config.policy, protocols=rt.config.sidecar_protocols,
                          progress=progress), warnings)


def refuse_namespace(rt: Runtime, body: kopf.Body) -> None:
    """Called only for namespaces *without* the opt-in label (the chart's namespaceSelector
    says so): a DataPipeline there would get no sidecars, since the pod webhook does not fire
    in such a namespace. Only CREATE: updates of a pipeline whose namespace lost the label
    later are not wedged (its status reports the pods without a sidecar)."""
    namespace = body.metadata.namespace or ""
    if not rt.config.watches(namespace):
        return
    job = ((body.get("spec") or {}).get("workload") or {}).get("name")
    raise kopf.AdmissionError(
        f"namespace {namespace!r} is not opted in to datalane: the sidecar webhook fires only "
        f"in namespaces labelled {NAMESPACE_OPT_IN_LABEL}={NAMESPACE_OPT_IN_VALUE}, so the "
        f"pods of spec.workload.name {job!r} would get no sidecar; label it first: kubectl "
        f"label namespace {namespace} {NAMESPACE_OPT_IN_LABEL}={NAMESPACE_OPT_IN_VALUE}",
        code=403)


async def inject_sidecar(rt: Runtime, body: kopf.Body, patch: kopf.Patch, pipelines: Index,
                         warnings: list[str], dryrun: bool = False) -> None:
    owner = trainer_pod_of(body)
    if owner is None:
        return  # not a trainer pod (nor a TrainJob's initializer): untouched
    kind, job = owner
    namespace = body.metadata.namespace or ""
    if not rt.config.watches(namespace):
        return
    found = await _pipeline_for(rt, namespace, job, pipelines, kind)
    if found is None:
        return
    try:
        pipeline = load_pipeline(found)
    except ConfigError as e:
        warnings.append(f"DataPipeline {found['metadata'].get('name')} is invalid, no sidecar "
                        f"injected: {e}")
        return
    try:  # a predicate stored while the webhook was off never reaches a sidecar
        rt.config.policy.check_predicates(pipeline.recipe)
        wanted = mutate_pod(dict(body), pipeline, rt.config.sidecar_image,
                            rt.config.policy.predicate_modules)
    except ConfigError as e:
        raise kopf.AdmissionError(str(e), code=422) from None
    if not dryrun:
        await _write_recipe(rt, pipeline)
    patch.fns.append(_become(wanted))


async def _write_recipe(rt: Runtime, pipeline: Pipeline) -> None:
    """Create the ConfigMap of the recipe the pod is injected with, unless it exists (or did
    less than :data:`~datalane_operator.recipemap.WRITTEN_TTL_S` ago); one that cannot be
    written refuses the pod (its controller retries), naming why."""
    name = configmap_name(pipeline)
    key = (pipeline.namespace, name)
    now = rt.clock()
    seen = rt.written.get(key)
    if seen is not None and now - seen < WRITTEN_TTL_S:
        return
    try:
        await rt.k().create_configmap(configmap_body(pipeline))
    except Exception as e:
        raise kopf.AdmissionError(
            f"cannot create ConfigMap {name!r}, the recipe of DataPipeline "
            f"{pipeline.name} that the pod's sidecar would mount: {_api_error(e)}; the pod is "
            f"refused rather than left waiting for it (its controller retries)",
            code=500) from None
    for stale in [k for k, t in rt.written.items() if now - t >= WRITTEN_TTL_S]:
        del rt.written[stale]
    rt.written[key] = now


def _api_error(e: Exception) -> str:
    """An API server's refusal as its status and message (an ``ApiException``'s body)."""
    status = getattr(e, "status", None)
    try:
        message = json.loads(getattr(e, "body", None) or "").get("message")
    except (ValueError, AttributeError, TypeError):
        message = None
    text = message or getattr(e, "reason", None) or str(e)
    return f"{status} {text}" if status else str(text)


def _become(wanted: Mapping[str, Any]) -> Callable[[Any], None]:
    def apply(body: Any) -> None:
        for key in ("metadata", "spec"):
            body[key] = wanted[key]
    return apply


async def _job_pipeline(rt: Runtime, body: kopf.Body, pipelines: Index,
                        kind: WorkloadKind = PYTORCHJOB,
                        ) -> tuple[Key, dict[str, Any], str] | None:
    """The job ``body``'s (namespace, name), the DataPipeline referencing it and the name of
    its trainer container; None when no pipeline references it."""
    key = (body.metadata.namespace or "", body.metadata.name or "")
    found = await _pipeline_for(rt, *key, pipelines, kind)
    if found is None:
        return None
    container = ((found.get("spec") or {}).get("workload") or {}).get("container")
    return key, found, str(container or kind.container)


def _lanes(found: Mapping[str, Any]) -> int:
    return int((found.get("spec") or {}).get("lanes", 0))


async def validate_workload(rt: Runtime, body: kopf.Body, old: Any, pipelines: Index,
                            warnings: list[str], kind: WorkloadKind = PYTORCHJOB) -> None:
    """A job of ``kind`` created or updated (a TrainJob's resize: ``spec.trainer.numNodes``)."""
    referenced = await _job_pipeline(rt, body, pipelines, kind)
    if referenced is None:
        return
    _, found, container = referenced
    if old is not None:
        before = kind.topology(dict(old), container, None).ranks
        if before == kind.topology(dict(body), container, None).ranks:
            return  # the world size did not change: never wedge a job's other updates
    _deny(review_workload(dict(body), _lanes(found), found["metadata"]["name"], container,
                          _parallelism(found), kind), warnings)


async def validate_scale(rt: Runtime, body: kopf.Body, pipelines: Index, jobs: Index,
                         warnings: list[str]) -> None:
    referenced = await _job_pipeline(rt, body, pipelines)
    if referenced is None:
        return
    key, found, container = referenced
    job = _first(jobs, key) or await rt.k().get_job(*key)
    if job is None:
        return
    _deny(review_scale(dict(body), job, _lanes(found),
                       found["metadata"]["name"], container, _parallelism(found)), warnings)


# ----------------------------------------------------------------------------- indexes


def pipeline_entry(body: Mapping[str, Any], namespace: str | None,
                   spec: Mapping[str, Any]) -> dict[Key, dict[str, Any]]:
    """The pipelines index's entry of a DataPipeline: by (namespace, workload name)."""
    workload = (spec.get("workload") or {}).get("name", "")
    return {(namespace or "", workload): {"apiVersion": body.get("apiVersion"),
                                          "kind": body.get("kind"),
                                          "metadata": dict(body.get("metadata") or {}),
                                          "spec": dict(spec)}}


def job_entry(name: str, namespace: str | None, spec: Mapping[str, Any]) -> dict[Key, Any]:
    """A job index's entry (PyTorchJob, TrainJob): its spec by (namespace, name)."""
    return {(namespace or "", name): {"metadata": {"name": name, "namespace": namespace},
                                      "spec": dict(spec)}}


def jobs_by_kind(kw: Mapping[str, Any]) -> dict[str, Any]:
    """The job index of each kind, by kind, from a handler's keyword arguments."""
    return {PYTORCHJOB.kind: kw["jobs"], TRAINJOB.kind: kw["trainjobs"]}

"""kopf registrations: thin adapters from cluster events to the runtime and the webhooks.

Every handler takes the :class:`~datalane_operator.runtime.Runtime` from kopf's ``memo``
(``datalane-operator run`` passes ``kopf.Memo(runtime=...)``) and calls into:

* **Admission** (:mod:`datalane_operator.webhooks`, served by kopf's webhook server on the
  paths of :mod:`datalane_operator.names`): validate DataPipelines, inject the sidecar into
  trainer pods of a pipeline's workload, guard the updates of PyTorchJobs and TrainJobs
  (a TrainJob's ``spec.trainer.numNodes``) and ``pytorchjobs/scale``, from the in-memory
  indexes below (one per kind of :mod:`datalane_operator.kinds`). Every replica serves admission.
* **Reconcile**, on the leader only (:mod:`datalane_operator.leader`): DataPipeline events
  whose generation is new to this leader, job and trainer pod events (a reconcile of the
  pipeline that references them), and a periodic look at every checkpoint store
  (:mod:`datalane_operator.loops`), coalesced by the runtime. Status is rebuilt from the world
  every time (:mod:`datalane_operator.reconciler`), so an operator restart or a new leader
  converges. Only kopf's stateless event handlers and indexes are used, never its changing
  handlers (``on.create``/``on.update``), which keep progress in annotations that two
  replicas would both write. No finalizer: the recipe ConfigMaps are owned by the pipeline and
  go with it; checkpoints are the user's data and stay.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from datalane_operator import loops, webhooks
from datalane_operator.kinds import PYTORCHJOB, TRAINJOB, WorkloadKind
from datalane_operator.names import (
    GROUP,
    PLURAL,
    VERSION,
    WEBHOOK_INJECT,
    WEBHOOK_REFUSE_NAMESPACE,
    WEBHOOK_VALIDATE_PIPELINE,
    WEBHOOK_VALIDATE_SCALE,
    WEBHOOK_VALIDATE_TRAINJOB,
    WEBHOOK_VALIDATE_WORKLOAD,
)
from datalane_operator.runtime import Key, runtime_of
from datalane_operator.settings import configure as apply_settings

__all__: list[str] = []


# ----------------------------------------------------------------------------- indexes


@kopf.index(GROUP, VERSION, PLURAL, id="pipelines")
def index_pipelines(body: kopf.Body, namespace: str | None, spec: kopf.Spec,
                    **_: Any) -> dict[Key, dict[str, Any]]:
    """DataPipelines by (namespace, workload name)."""
    return webhooks.pipeline_entry(body, namespace, spec)


@kopf.index(PYTORCHJOB.group, PYTORCHJOB.version, PYTORCHJOB.plural, id="jobs")
def index_jobs(name: str, namespace: str | None, spec: kopf.Spec,
               **_: Any) -> dict[Key, Any]:
    """PyTorchJob specs by (namespace, name)."""
    return webhooks.job_entry(name, namespace, spec)


@kopf.index(TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural, id="trainjobs")
def index_trainjobs(name: str, namespace: str | None, spec: kopf.Spec,
                    **_: Any) -> dict[Key, Any]:
    """TrainJob specs by (namespace, name)."""
    return webhooks.job_entry(name, namespace, spec)


# ----------------------------------------------------------------------------- admission


@kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_VALIDATE_PIPELINE,
                  operations=["CREATE", "UPDATE"])
async def validate_pipeline(body: kopf.Body, warnings: list[str], memo: Any,
                            **kw: Any) -> None:
    await webhooks.validate_pipeline(runtime_of(memo), body, kw.get("old"), kw["pipelines"],
                                     webhooks.jobs_by_kind(kw), warnings)


@kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_REFUSE_NAMESPACE, operations=["CREATE"])
async def refuse_namespace(body: kopf.Body, memo: Any, **_: Any) -> None:
    webhooks.refuse_namespace(runtime_of(memo), body)


@kopf.on.mutate("", "v1", "pods", id=WEBHOOK_INJECT, operations=["CREATE"])
async def inject_sidecar(body: kopf.Body, patch: kopf.Patch, warnings: list[str], memo: Any,
                         dryrun: bool = False, **kw: Any) -> None:
    await webhooks.inject_sidecar(runtime_of(memo), body, patch, kw["pipelines"], warnings,
                                  dryrun=dryrun)


@kopf.on.validate(PYTORCHJOB.group, PYTORCHJOB.version, PYTORCHJOB.plural,
                  id=WEBHOOK_VALIDATE_WORKLOAD, operations=["CREATE", "UPDATE"])
async def validate_workload(body: kopf.Body, warnings: list[str], memo: Any,
                            **kw: Any) -> None:
    await webhooks.validate_workload(runtime_of(memo), body, kw.get("old"), kw["pipelines"],
                                     warnings, PYTORCHJOB)


@kopf.on.validate(TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural,
                  id=WEBHOOK_VALIDATE_TRAINJOB, operations=["CREATE", "UPDATE"])
async def validate_trainjob(body: kopf.Body, warnings: list[str], memo: Any,
                            **kw: Any) -> None:
    await webhooks.validate_workload(runtime_of(memo), body, kw.get("old"), kw["pipelines"],
                                     warnings, TRAINJOB)


@kopf.on.validate(PYTORCHJOB.group, PYTORCHJOB.version, PYTORCHJOB.plural,
                  subresource="scale", id=WEBHOOK_VALIDATE_SCALE, operations=["UPDATE"])
async def validate_scale(body: kopf.Body, warnings: list[str], memo: Any, **kw: Any) -> None:
    await webhooks.validate_scale(runtime_of(memo), body, kw["pipelines"], kw["jobs"],
                                  warnings)


# ----------------------------------------------------------------------------- reconcile


@kopf.on.event(GROUP, VERSION, PLURAL, id="pipeline-event")
async def pipeline_event(type: str, name: str, namespace: str | None, meta: kopf.Meta,
                         memo: Any, **_: Any) -> None:
    runtime_of(memo).pipeline_changed((namespace or "", name), type,
                                      int(meta.get("generation") or 0))


@kopf.on.event(PYTORCHJOB.group, PYTORCHJOB.version, PYTORCHJOB.plural, id="job-event")
async def job_event(name: str, namespace: str | None, memo: Any, **kw: Any) -> None:
    runtime_of(memo).workload_changed(namespace or "", name, kw["pipelines"])


@kopf.on.event(TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural, id="trainjob-event")
async def trainjob_event(name: str, namespace: str | None, memo: Any, **kw: Any) -> None:
    runtime_of(memo).workload_changed(namespace or "", name, kw["pipelines"])


def _pod_changed(kind: WorkloadKind, labels: Mapping[str, str], namespace: str | None,
                 memo: Any, pipelines: Any) -> None:
    runtime_of(memo).workload_changed(namespace or "", labels.get(kind.job_label, ""),
                                      pipelines)


@kopf.on.event("", "v1", "pods", id="pod-event",
               labels={PYTORCHJOB.job_label: kopf.PRESENT})
async def pod_event(labels: Mapping[str, str], namespace: str | None, memo: Any,
                    **kw: Any) -> None:
    _pod_changed(PYTORCHJOB, labels, namespace, memo, kw["pipelines"])


@kopf.on.event("", "v1", "pods", id="trainjob-pod-event",
               labels={TRAINJOB.job_label: kopf.PRESENT, **TRAINJOB.trainer_labels})
async def trainjob_pod_event(labels: Mapping[str, str], namespace: str | None, memo: Any,
                             **kw: Any) -> None:
    _pod_changed(TRAINJOB, labels, namespace, memo, kw["pipelines"])


# ----------------------------------------------------------------------------- lifecycle


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    rt = runtime_of(memo)
    apply_settings(settings, rt)
    await rt.serve_metrics()
    if rt.config.webhook_configuration and rt.config.ca_file:
        rt.background.append(rt.spawn(loops.ca_loop(rt)))


@kopf.on.startup(id="storage-loop")
async def start_storage_loop(memo: Any, **kw: Any) -> None:
    rt = runtime_of(memo)
    rt.start(kw["pipelines"], rt.coordination_api)


@kopf.on.cleanup()
async def stop_background(memo: Any, **_: Any) -> None:
    await runtime_of(memo).stop()


@kopf.on.probe(id="admission")
def probe_admission(memo: Any, **_: Any) -> dict[str, Any]:
    return runtime_of(memo).admission.summary()


@kopf.on.probe(id="reconcile")
def probe_reconcile(memo: Any, **_: Any) -> dict[str, Any]:
    return runtime_of(memo).reconcile_latency.summary()


@kopf.on.probe(id="leader")
def probe_leader(memo: Any, **_: Any) -> dict[str, Any]:
    return runtime_of(memo).leader_probe()

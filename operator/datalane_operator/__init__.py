"""datalane's Kubernetes operator: the DataPipeline CRD, sidecar injection, the scale guard,
status from the world, checkpoint garbage collection.

Thin kopf registrations (:mod:`datalane_operator.handlers`, over the runtime that kopf's
``memo`` carries: :mod:`~datalane_operator.runtime`) over pure functions: the CR model
(:mod:`~datalane_operator.pipeline`), admission verdicts (:mod:`~datalane_operator.admission`),
pod mutation (:mod:`~datalane_operator.inject`), PyTorchJob topology
(:mod:`~datalane_operator.workload`), reconcile decisions (:mod:`~datalane_operator.reconcile`)
and the CRD generator (:mod:`~datalane_operator.crd`). Depends only on :mod:`datalane.spec` and
:mod:`datalane.store` within datalane; kopf and the Kubernetes client are imported only by
the modules that face them (handlers, webhooks, settings, kube), so the pure parts load
without them.
"""

from datalane_operator.admission import Verdict, review_pipeline, review_scale, review_workload
from datalane_operator.crd import crd_manifest, crd_yaml
from datalane_operator.inject import mutate_pod, pipeline_for_pod
from datalane_operator.pipeline import Pipeline, PipelineSpec, compose_recipe, load_pipeline
from datalane_operator.reconcile import Decision, Event, decide
from datalane_operator.workload import Topology, check_workers, topology_of

__all__ = [
    "Decision",
    "Event",
    "Pipeline",
    "PipelineSpec",
    "Topology",
    "Verdict",
    "check_workers",
    "compose_recipe",
    "crd_manifest",
    "crd_yaml",
    "decide",
    "load_pipeline",
    "mutate_pod",
    "pipeline_for_pod",
    "review_pipeline",
    "review_scale",
    "review_workload",
    "topology_of",
]

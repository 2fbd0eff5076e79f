"""Secrets are read, and pods deleted, only where the chart lets the operator: a
namespace without the chart's RoleBinding answers 403, and the operator reports a
store it may not touch, or pods it may not restart, naming the Helm value that fixes it,
instead of a failed storage look, edit or reconcile."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from datalane_operator.inject import mutate_pod
from datalane_operator.kube import Kube, SecretForbidden
from datalane_operator.pipeline import load_pipeline
from datalane_operator.reconciler import look_at_store, reconcile, store_progress
from datalane_operator.runtime import OperatorConfig, Runtime
from datalane_operator.storage import Listing
from kubernetes import client
from kubernetes.client.rest import ApiException

from .builders import RECIPE, dp, job, pod

FORBIDDEN = ("the operator may not read Secret 's3-creds' (spec.checkpoint.secretRef) in "
             "namespace 'team-c': it reads Secrets only where the Helm chart grants it, the "
             "namespaces of operator.watchNamespaces and operator.optedInNamespaces; add "
             "'team-c' to operator.optedInNamespaces, or bind the chart's ClusterRole "
             "<fullname>-opted-in to the operator's ServiceAccount with a RoleBinding in "
             "'team-c' (docs/operator.md#rbac)")


class ForbiddingCore:
    """The CoreV1Api of an API server whose RBAC does not grant Secrets in team-c."""

    def read_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    def delete_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    def list_namespaced_config_map(self, namespace: str, **kw: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")


def kube() -> Kube:
    k = Kube(client.ApiClient(client.Configuration()))
    k.core = ForbiddingCore()
    return k


def test_a_forbidden_secret_is_a_store_the_operator_may_not_touch() -> None:
    body = dp(namespace="team-c")
    rt = Runtime(OperatorConfig(), kube=kube())
    try:
        asyncio.run(kube().read_secret("team-c", "s3-creds"))
    except SecretForbidden as e:
        assert str(e) == FORBIDDEN
    else:
        raise AssertionError("no SecretForbidden")
    listing = asyncio.run(look_at_store(rt, load_pipeline(body)))
    assert (listing.ok, listing.denied, listing.error) == (False, True, FORBIDDEN)
    progress = asyncio.run(store_progress(rt, body))  # a recipe edit is refused with it
    assert progress.error == FORBIDDEN
    counted = {k: n for k, n in rt.metrics.store_operations.items() if n}  # others at 0
    assert counted == {(("kind", "look"), ("outcome", "denied")): 1,
                       (("kind", "progress"), ("outcome", "denied")): 1}


class ForbiddenNamespace(Kube):
    """A namespace where the chart grants no pod deletion: the real ``delete_pod`` over a
    CoreV1Api that answers 403, the reads of a job whose pods serve an older recipe."""

    def __init__(self, pipeline: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.core = ForbiddingCore()
        self.body, self.pods = pipeline, pods
        self.patches: list[dict[str, Any]] = []
        self.events: list[Any] = []

    async def get_pipeline(self, namespace: str, name: str) -> dict[str, Any]:
        return self.body

    async def ensure_recipe_configmap(self, pipeline: Any) -> None:
        return None

    async def get_job(self, namespace: str, name: str, kind: Any = None) -> dict[str, Any]:
        return job(workers=2)

    async def list_job_pods(self, namespace: str, job: str,
                            kind: Any = None) -> list[dict[str, Any]]:
        return self.pods

    async def patch_status(self, namespace: str, name: str, patch: Any) -> None:
        self.patches.append(dict(patch))

    async def post_event(self, obj: Any, event: Any) -> None:
        self.events.append(event)


def test_a_forbidden_restart_is_reported_not_a_failed_reconcile() -> None:
    old = load_pipeline(dp(namespace="team-c"))
    new = dp(namespace="team-c", recipe={**copy.deepcopy(RECIPE), "phases": [
        {"name": "anneal", "start_step": 500, "weights": {"web": 1.0}}]})
    pods = [mutate_pod(pod(f"llama-worker-{i}", phase="Running", namespace="team-c"), old,
                       "img:1") for i in range(2)]
    kube = ForbiddenNamespace(new, pods)
    rt = Runtime(OperatorConfig(), kube=kube)
    rt.listings[("team-c", "pretrain")] = Listing("s3://ckpt/run-1", [300, 400])
    asyncio.run(reconcile(rt, ("team-c", "pretrain")))  # no exception: the status is written
    (patch,) = kube.patches
    rolled = next(c for c in patch["conditions"] if c["type"] == "PhaseRolled")
    why = ("the operator may not delete pods in namespace 'team-c': it does only where the Helm "
           "chart grants it, the namespaces of operator.watchNamespaces and "
           "operator.optedInNamespaces; add 'team-c' to operator.optedInNamespaces, or bind the "
           "chart's ClusterRole <fullname>-opted-in to the operator's ServiceAccount with a "
           "RoleBinding in 'team-c' (docs/operator.md#rbac), or delete the pods yourself")
    assert (rolled["status"], rolled["reason"]) == ("False", "RestartForbidden")
    assert rolled["message"] == (
        "restarting 2 pods serving an older recipe (llama-worker-0, llama-worker-1) at step "
        "400 (the newest checkpoint): they resume there under the recipe with phase 'anneal' "
        f"(from step 500): {why}")
    assert [(e.type, e.reason, e.message) for e in kube.events if e.type == "Warning"] == [
        ("Warning", "RestartForbidden", why)]


def test_forbidden_recipe_collection_is_logged_once_not_a_failed_reconcile(
        caplog: pytest.LogCaptureFixture) -> None:
    kube = ForbiddenNamespace(dp(namespace="team-c"), [])
    rt = Runtime(OperatorConfig(), kube=kube)
    with caplog.at_level(logging.WARNING, logger="datalane.operator"):
        for _ in range(3):
            asyncio.run(reconcile(rt, ("team-c", "pretrain")))
    assert len(kube.patches) == 3  # each reconcile wrote the status
    assert [r.getMessage() for r in caplog.records] == [
        "the operator may not list or delete ConfigMaps in namespace 'team-c', so the recipe "
        "ConfigMaps of older recipes stay until their DataPipeline is deleted: it does only "
        "where the Helm chart grants it, the namespaces of operator.watchNamespaces and "
        "operator.optedInNamespaces; add 'team-c' to operator.optedInNamespaces, or bind the "
        "chart's ClusterRole <fullname>-opted-in to the operator's ServiceAccount with a "
        "RoleBinding in 'team-c' (docs/operator.md#rbac)"]

"""Secrets are read only where the chart lets the operator (issue 22 part 4): a namespace
without the chart's RoleBinding answers 403, and the operator reports that as a store it may
not touch, naming the Helm value that fixes it, instead of a failed storage look or edit."""

from __future__ import annotations

import asyncio
from typing import Any

from datalane_operator.kube import Kube, SecretForbidden
from datalane_operator.pipeline import load_pipeline
from datalane_operator.reconciler import look_at_store, store_progress
from datalane_operator.runtime import OperatorConfig, Runtime
from kubernetes import client
from kubernetes.client.rest import ApiException

from .builders import dp

FORBIDDEN = ("the operator may not read Secret 's3-creds' (spec.checkpoint.secretRef) in "
             "namespace 'team-c': it reads Secrets only where the Helm chart grants it, the "
             "namespaces of operator.watchNamespaces and operator.secretNamespaces; add "
             "'team-c' to operator.secretNamespaces, or bind the chart's ClusterRole "
             "<fullname>-secrets to the operator's ServiceAccount with a RoleBinding in "
             "'team-c' (docs/operator.md#rbac)")


class ForbiddingCore:
    """The CoreV1Api of an API server whose RBAC does not grant Secrets in team-c."""

    def read_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Any:
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
    assert rt.metrics.store_operations == {(("kind", "look"), ("outcome", "denied")): 1,
                                           (("kind", "progress"), ("outcome", "denied")): 1}

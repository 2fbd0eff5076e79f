"""The few Kubernetes API calls the operator makes, as plain dicts, off the event loop.

Every call here is one the Helm chart's RBAC grants (and nothing more is granted):

=========================================  =====================================
resource                                   verbs
=========================================  =====================================
datapipelines (+ watch by kopf)            get, list, watch
datapipelines/status                       patch
customresourcedefinitions (kopf)           list, watch
pytorchjobs, trainjobs (+ watch by kopf)   get, list, watch
pods (watch by kopf)                       list, watch, delete (to roll an edited recipe)
configmaps (the recipes)                   create, patch (adopt); list, delete (collect, below)
secrets (spec.checkpoint.secretRef)        get (only where the chart binds it, see below)
events                                     create
mutating/validatingwebhookconfigurations   get, patch (the chart's own, by name)
leases (release namespace)                 create; get, update (the chart's Lease)
=========================================  =====================================

Watching a list of namespaces (``--namespace``), the chart grants the namespaced rows only in
those namespaces (a Role each); customresourcedefinitions and the webhook configurations stay
cluster-wide. Secrets are never readable, nor pods and ConfigMaps deletable (nor ConfigMaps
listed), cluster-wide: the chart binds its ClusterRole ``<fullname>-opted-in`` (``get``
secrets, ``delete`` pods, ``list``/``delete`` configmaps) in each watched namespace and each
of ``operator.optedInNamespaces``; elsewhere :meth:`Kube.read_secret` raises
:class:`SecretForbidden`, which the storage looks and the recipe-edit guard report,
:meth:`Kube.delete_pod` :class:`PodDeleteForbidden`, which the rollout reports, and the
recipe ConfigMaps' listing and deletion :class:`ConfigMapsForbidden`, which the reconcile
logs (old recipes then stay until the pipeline goes).

The synchronous ``kubernetes`` client runs in worker threads (:func:`asyncio.to_thread`: the
default executor, which the checkpoint store's looks never use, so a hanging store cannot take
its threads; see :mod:`datalane_operator.runtime`);
responses are decoded straight from JSON (``_preload_content=False``), which is much faster
than the client's model objects for a job of a thousand pods.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes import client  # type: ignore[import-untyped]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

from datalane_operator.kinds import PYTORCHJOB, WorkloadKind
from datalane_operator.names import (
    FIELD_MANAGER,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
)
from datalane_operator.reconcile import Event

__all__ = ["ConfigMapsForbidden", "Kube", "PodDeleteForbidden", "SecretForbidden",
           "load_configuration", "status_patch"]

log = logging.getLogger("datalane.operator")
_TIMEOUT = 30


class SecretForbidden(PermissionError):
    """The API server refused the operator a Secret (RBAC): its namespace is not one where
    the chart lets the operator read Secrets."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(
            f"the operator may not read Secret {name!r} (spec.checkpoint.secretRef) in "
            f"namespace {namespace!r}: it reads Secrets only where the Helm chart grants it, "
            f"the namespaces of operator.watchNamespaces and operator.optedInNamespaces; add "
            f"{namespace!r} to operator.optedInNamespaces, or bind the chart's ClusterRole "
            f"<fullname>-opted-in to the operator's ServiceAccount with a RoleBinding in "
            f"{namespace!r} (docs/operator.md#rbac)")
        self.namespace, self.name = namespace, name


class PodDeleteForbidden(PermissionError):
    """The API server refused the operator a pod's deletion (RBAC), as for Secrets."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"the operator may not delete pods in namespace {namespace!r}: it does only where "
            f"the Helm chart grants it, the namespaces of operator.watchNamespaces and "
            f"operator.optedInNamespaces; add {namespace!r} to operator.optedInNamespaces, or "
            f"bind the chart's ClusterRole <fullname>-opted-in to the operator's "
            f"ServiceAccount with a RoleBinding in {namespace!r} (docs/operator.md#rbac), or "
            f"delete the pods yourself")
        self.namespace = namespace


class ConfigMapsForbidden(PermissionError):
    """The API server refused the operator the listing or deletion of ConfigMaps (RBAC)."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"the operator may not list or delete ConfigMaps in namespace {namespace!r}, so "
            f"the recipe ConfigMaps of older recipes stay until their DataPipeline is deleted: "
            f"it does only where the Helm chart grants it, the namespaces of "
            f"operator.watchNamespaces and operator.optedInNamespaces; add {namespace!r} to "
            f"operator.optedInNamespaces, or bind the chart's ClusterRole <fullname>-opted-in "
            f"to the operator's ServiceAccount with a RoleBinding in {namespace!r} "
            f"(docs/operator.md#rbac)")
        self.namespace = namespace


def status_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning status ``old`` into ``new`` (removed keys become null)."""
    patch: dict[str, Any] = {k: None for k in (old or {}) if k not in new}
    patch.update(new)
    return patch


def load_configuration() -> Any:
    """The client configuration: in-cluster (ServiceAccount), else the kubeconfig.

    Loaded here rather than borrowed from kopf's login, which may not have run yet when a
    startup task makes its first call.
    """
    from kubernetes import config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        config.load_kube_config(client_configuration=cfg)
    return cfg


class Kube:
    """Thin async wrappers over the ``kubernetes`` client (configured like kopf's login)."""

    def __init__(self, api_client: Any = None) -> None:
        self.api = api_client or client.ApiClient(load_configuration())
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.admission = client.AdmissionregistrationV1Api(self.api)

    # -- helpers -------------------------------------------------------------------------
    @staticmethod
    def _json(resp: Any) -> Any:
        return json.loads(resp.data)

    async def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        kw.setdefault("_request_timeout", _TIMEOUT)
        return await asyncio.to_thread(fn, *args, **kw)

    async def _get(self, fn: Any, *args: Any) -> Any:
        try:
            return self._json(await self._call(fn, *args, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    # -- reads ---------------------------------------------------------------------------
    async def get_pipeline(self, namespace: str, name: str) -> dict[str, Any] | None:
        out: dict[str, Any] | None = await self._get(
            self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        return out

    async def list_pipelines(self, namespace: str) -> list[dict[str, Any]]:
        out = await self._get(self.custom.list_namespaced_custom_object, GROUP, VERSION,
                              namespace, PLURAL)
        return list((out or {}).get("items") or [])

    async def get_job(self, namespace: str, name: str,
                      kind: WorkloadKind = PYTORCHJOB) -> dict[str, Any] | None:
        out: dict[str, Any] | None = await self._get(
            self.custom.get_namespaced_custom_object, kind.group, kind.version, namespace,
            kind.plural, name)
        return out

    async def list_job_pods(self, namespace: str, job: str,
                            kind: WorkloadKind = PYTORCHJOB) -> list[dict[str, Any]]:
        """The trainer pods of ``job`` (a TrainJob's initializer pods are not)."""
        resp = await self._call(self.core.list_namespaced_pod, namespace,
                                label_selector=kind.selector(job),
                                _preload_content=False)
        return list(self._json(resp).get("items") or [])

    async def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data, decoded; None if it does not exist. Never logged. Raises
        :class:`SecretForbidden` where the operator may not read Secrets (the chart grants
        that only in the namespaces it binds ``<fullname>-opted-in`` in)."""
        try:
            out = await self._get(self.core.read_namespaced_secret, name, namespace)
        except ApiException as e:
            if e.status == 403:
                raise SecretForbidden(namespace, name) from None
            raise
        if out is None:
            return None
        return {k: base64.b64decode(v).decode("utf-8", "replace")
                for k, v in (out.get("data") or {}).items()}

    # -- writes --------------------------------------------------------------------------
    async def patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        await self._call(self.custom.patch_namespaced_custom_object_status, GROUP, VERSION,
                         namespace, PLURAL, name, {"status": dict(patch)},
                         field_manager=FIELD_MANAGER)

    async def create_configmap(self, body: Mapping[str, Any]) -> bool:
        """Create the ConfigMap ``body``; False when one of its name exists already (a recipe
        ConfigMap's name says its content: :mod:`datalane_operator.recipemap`)."""
        meta = body["metadata"]
        try:
            await self._call(self.core.create_namespaced_config_map, meta["namespace"],
                             dict(body), field_manager=FIELD_MANAGER)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        log.info("created ConfigMap %s/%s", meta["namespace"], meta["name"])
        return True

    async def ensure_recipe_configmap(self, body: Mapping[str, Any]) -> None:
        """Create the recipe ConfigMap ``body`` (:func:`~datalane_operator.recipemap.
        configmap_body`), or adopt the one of its name: its labels and owner reference become
        ``body``'s, so that one left by a deleted pipeline of the same name and recipe is not
        garbage-collected under the new pipeline's pods. Its data is never written twice."""
        if await self.create_configmap(body):
            return
        meta = body["metadata"]
        adopt = {"metadata": {"labels": meta["labels"],
                              "ownerReferences": meta.get("ownerReferences") or []}}
        await self._call(self.core.patch_namespaced_config_map, meta["name"], meta["namespace"],
                         adopt, field_manager=FIELD_MANAGER)

    async def list_configmaps(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The ConfigMaps of ``namespace`` matching the label ``selector``."""
        try:
            resp = await self._call(self.core.list_namespaced_config_map, namespace,
                                    label_selector=selector, _preload_content=False)
        except ApiException as e:
            if e.status == 403:
                raise ConfigMapsForbidden(namespace) from None
            raise
        return list(self._json(resp).get("items") or [])

    async def _delete(self, fn: Any, namespace: str, name: str, uid: str,
                      forbidden: type[PermissionError]) -> bool:
        """Delete one object only if it is still the one ``uid`` (one recreated under its name
        in the meantime is left alone); False when it was gone or replaced. A refusal by RBAC
        raises ``forbidden(namespace)``."""
        try:
            await self._call(fn, name, namespace,
                             body={"preconditions": {"uid": uid}} if uid else None)
        except ApiException as e:
            if e.status == 403:
                raise forbidden(namespace) from None
            if e.status not in (404, 409):
                raise
            return False
        return True

    async def delete_configmap(self, namespace: str, name: str, uid: str) -> None:
        """Delete one ConfigMap (a recipe no pod mounts), as :meth:`_delete`."""
        if await self._delete(self.core.delete_namespaced_config_map, namespace, name, uid,
                              ConfigMapsForbidden):
            log.info("deleted ConfigMap %s/%s: no pod mounts its recipe", namespace, name)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete one pod (its controller recreates it), as :meth:`_delete`."""
        await self._delete(self.core.delete_namespaced_pod, namespace, name, uid,
                           PodDeleteForbidden)

    async def post_event(self, obj: Mapping[str, Any], event: Event) -> None:
        meta = obj.get("metadata") or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get(
                "namespace")},
            "involvedObject": {"apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"),
                               "kind": obj.get("kind", KIND), "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": event.type, "reason": event.reason, "message": event.message[:1024],
            "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        await self._call(self.core.create_namespaced_event, meta.get("namespace"), body)

    async def patch_ca_bundle(self, configuration: str, ca_pem: bytes) -> list[str]:
        """Put ``ca_pem`` in every webhook of the mutating and the validating configuration
        named ``configuration``; returns what was patched."""
        bundle = base64.b64encode(ca_pem).decode()
        done = []
        for kind, read, patch in (
                ("MutatingWebhookConfiguration",
                 self.admission.read_mutating_webhook_configuration,
                 self.admission.patch_mutating_webhook_configuration),
                ("ValidatingWebhookConfiguration",
                 self.admission.read_validating_webhook_configuration,
                 self.admission.patch_validating_webhook_configuration)):
            current = await self._get(read, configuration)
            if current is None:
                continue
            hooks = current.get("webhooks") or []
            if all((h.get("clientConfig") or {}).get("caBundle") == bundle for h in hooks):
                continue
            ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                   for i in range(len(hooks))]
            await self._call(patch, configuration, ops)
            done.append(f"{kind}/{configuration}")
        return done

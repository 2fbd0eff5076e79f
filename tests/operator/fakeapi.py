"""An API server in memory for the operator's own calls: the ConfigMap and pod calls of
``CoreV1Api`` answered as the API server answers them (409 on a name taken, 404 on a missing
object, 422 on a write of an immutable ConfigMap's data, 409 on a failed uid precondition),
under the real :class:`~datalane_operator.kube.Kube`; the custom objects (the DataPipeline,
its PyTorchJob, status patches and events) as plain fields.

Used by the tests of the recipe ConfigMaps (tests/operator/test_recipe_configmaps.py) and
of the pod webhook, which writes one."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from datalane_operator.kube import Kube
from kubernetes import client
from kubernetes.client.rest import ApiException

__all__ = ["FakeCore", "FakeKube"]


class _Response:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()


def _error(status: int, message: str) -> ApiException:
    e = ApiException(status=status, reason={404: "Not Found", 409: "Conflict",
                                            422: "Unprocessable Entity"}.get(status, "Error"))
    e.body = json.dumps({"kind": "Status", "message": message, "code": status})
    return e


def _selected(obj: dict[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    pairs = [term.split("=", 1) for term in selector.split(",") if term]
    return all(labels.get(k) == v for k, v in pairs)


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    """A JSON merge patch (RFC 7386): mappings merge, anything else replaces, null deletes."""
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


class FakeCore:
    """The ConfigMap and pod calls of ``CoreV1Api``; ``calls`` records every one, ``refuse``
    maps a method name to the exception it raises."""

    def __init__(self) -> None:
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse: dict[str, Exception] = {}
        self._uids = itertools.count(1)

    def _enter(self, method: str, name: str) -> None:
        self.calls.append((method, name))
        if method in self.refuse:
            raise self.refuse[method]

    def add(self, table: dict[tuple[str, str], dict[str, Any]], body: dict[str, Any],
            namespace: str) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = namespace
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        table[(namespace, meta["name"])] = obj
        return obj

    # -- configmaps -------------------------------------------------------------------
    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any],
                                     **_: Any) -> Any:
        name = body["metadata"]["name"]
        self._enter("create_namespaced_config_map", name)
        if (namespace, name) in self.configmaps:
            raise _error(409, f'configmaps "{name}" already exists')
        return self.add(self.configmaps, body, namespace)

    def patch_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any],
                                    **_: Any) -> Any:
        self._enter("patch_namespaced_config_map", name)
        current = self.configmaps.get((namespace, name))
        if current is None:
            raise _error(404, f'configmaps "{name}" not found')
        if current.get("immutable") and any(
                k in body and body[k] != current.get(k) for k in ("data", "binaryData")):
            raise _error(422, f'ConfigMap "{name}" is invalid: data: Forbidden: field is '
                              f'immutable when `immutable` is set')
        _merge(current, body)
        return current

    def list_namespaced_config_map(self, namespace: str, label_selector: str = "",
                                   **_: Any) -> Any:
        self._enter("list_namespaced_config_map", label_selector)
        return _Response({"items": [cm for (ns, _n), cm in sorted(self.configmaps.items())
                                    if ns == namespace and _selected(cm, label_selector)]})

    def delete_namespaced_config_map(self, name: str, namespace: str, body: Any = None,
                                     **_: Any) -> Any:
        self._enter("delete_namespaced_config_map", name)
        current = self.configmaps.get((namespace, name))
        if current is None:
            raise _error(404, f'configmaps "{name}" not found')
        uid = ((body or {}).get("preconditions") or {}).get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise _error(409, f"Precondition failed: UID in precondition: {uid}")
        del self.configmaps[(namespace, name)]

    # -- pods -------------------------------------------------------------------------
    def list_namespaced_pod(self, namespace: str, label_selector: str = "", **_: Any) -> Any:
        self._enter("list_namespaced_pod", label_selector)
        return _Response({"items": [p for (ns, _n), p in sorted(self.pods.items())
                                    if ns == namespace and _selected(p, label_selector)]})

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any = None,
                              **_: Any) -> Any:
        self._enter("delete_namespaced_pod", name)
        if self.pods.pop((namespace, name), None) is None:
            raise _error(404, f'pods "{name}" not found')


class FakeKube(Kube):
    """The real :class:`Kube` over :class:`FakeCore`; the DataPipeline ``body`` and the
    PyTorchJob ``job`` as fields, the status patches and events recorded."""

    def __init__(self, body: dict[str, Any], job: dict[str, Any] | None = None) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.core = FakeCore()
        self.body, self.job = body, job
        self.patches: list[dict[str, Any]] = []
        self.events: list[Any] = []

    async def get_pipeline(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body)

    async def list_pipelines(self, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.body)]

    async def get_job(self, namespace: str, name: str,
                      kind: Any = None) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    async def patch_status(self, namespace: str, name: str, patch: Any) -> None:
        self.patches.append(dict(patch))
        status = self.body.setdefault("status", {})
        _merge(status, dict(patch))

    async def post_event(self, obj: Any, event: Any) -> None:
        self.events.append(event)

"""The apiserver is real: version, CRD structural schema, create/watch/patch, GC."""

from __future__ import annotations

import json
import queue
import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from .harness import Cluster
from .util import eventually

GROUP = "test.datalane.io"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.size",
                        "statusReplicasPath": ".status.size",
                    },
                },
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 64},
                                    "mode": {"type": "string", "enum": ["fast", "exact"]},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"size": {"type": "integer"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def widget_crd(k8s_cluster: Cluster, k8s_api: client.ApiClient) -> str:
    ext = client.ApiextensionsV1Api(k8s_api)
    try:
        ext.create_custom_resource_definition(CRD)
    except ApiException as e:
        if e.status != 409:
            raise
    k8s_cluster.wait_crd_established(f"widgets.{GROUP}")
    return f"widgets.{GROUP}"


def widget(name: str, spec: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def test_server_version_is_the_built_release(k8s_cluster: Cluster, k8s_api: client.ApiClient):
    info = client.VersionApi(k8s_api).get_code()
    assert info.git_version.startswith("v1.")
    assert info.major == "1" and int(info.minor) >= 35
    out = json.loads(k8s_cluster.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == info.git_version
    assert out["clientVersion"]["gitVersion"] == info.git_version


def test_crd_structural_schema_rejects_invalid_objects(
    widget_crd: str, k8s_api: client.ApiClient, k8s_namespace: str
):
    api = client.CustomObjectsApi(k8s_api)
    ok = api.create_namespaced_custom_object(
        GROUP,
        "v1",
        k8s_namespace,
        "widgets",
        widget("good", {"size": 3, "mode": "fast", "unknown": "pruned"}),
    )
    # Structural schema: unknown fields are pruned, not stored.
    assert ok["spec"] == {"size": 3, "mode": "fast"}

    for name, spec, needle in [
        ("too-small", {"size": 0}, "spec.size"),
        ("wrong-type", {"size": "three"}, "spec.size"),
        ("bad-enum", {"size": 1, "mode": "sloppy"}, "spec.mode"),
        ("missing", {"mode": "fast"}, "spec.size"),
    ]:
        with pytest.raises(ApiException) as exc:
            api.create_namespaced_custom_object(
                GROUP, "v1", k8s_namespace, "widgets", widget(name, spec)
            )
        assert exc.value.status == 422, exc.value.body
        assert needle in exc.value.body


def test_status_and_scale_subresources(
    widget_crd: str, k8s_api: client.ApiClient, k8s_namespace: str
):
    api = client.CustomObjectsApi(k8s_api)
    api.create_namespaced_custom_object(
        GROUP, "v1", k8s_namespace, "widgets", widget("w", {"size": 2})
    )
    # status is only writable through /status
    api.patch_namespaced_custom_object(
        GROUP, "v1", k8s_namespace, "widgets", "w", {"status": {"size": 99}}
    )
    got = api.get_namespaced_custom_object(GROUP, "v1", k8s_namespace, "widgets", "w")
    assert "status" not in got or got["status"].get("size") != 99
    api.patch_namespaced_custom_object_status(
        GROUP, "v1", k8s_namespace, "widgets", "w", {"status": {"size": 2}}
    )
    scale = api.get_namespaced_custom_object_scale(GROUP, "v1", k8s_namespace, "widgets", "w")
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    api.patch_namespaced_custom_object_scale(
        GROUP, "v1", k8s_namespace, "widgets", "w", {"spec": {"replicas": 5}}
    )
    got = api.get_namespaced_custom_object(GROUP, "v1", k8s_namespace, "widgets", "w")
    assert got["spec"]["size"] == 5
    # the scale subresource validates against the schema too (maximum 64)
    with pytest.raises(ApiException) as exc:
        api.patch_namespaced_custom_object_scale(
            GROUP, "v1", k8s_namespace, "widgets", "w", {"spec": {"replicas": 65}}
        )
    assert exc.value.status == 422


def test_create_watch_patch(k8s_api: client.ApiClient, k8s_namespace: str):
    core = client.CoreV1Api(k8s_api)
    events: queue.Queue[tuple[str, dict[str, str]]] = queue.Queue()
    w = watch.Watch()
    started = threading.Event()

    def run() -> None:
        started.set()
        for ev in w.stream(
            core.list_namespaced_config_map,
            k8s_namespace,
            field_selector="metadata.name=cfg",
            timeout_seconds=60,
        ):
            events.put((ev["type"], dict(ev["object"].data or {})))
            if ev["type"] == "DELETED":
                break

    t = threading.Thread(target=run, daemon=True)
    t.start()
    started.wait()
    # the watch may open after the create; the initial list of a watch delivers ADDED anyway
    core.create_namespaced_config_map(
        k8s_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"a": "1"})
    )
    core.patch_namespaced_config_map("cfg", k8s_namespace, {"data": {"b": "2"}})
    patched = core.read_namespaced_config_map("cfg", k8s_namespace)
    assert patched.data == {"a": "1", "b": "2"}
    # a JSON patch (list body) removes a key
    core.patch_namespaced_config_map("cfg", k8s_namespace, [{"op": "remove", "path": "/data/a"}])
    core.delete_namespaced_config_map("cfg", k8s_namespace)

    seen = []
    while True:
        kind, data = events.get(timeout=30)
        seen.append((kind, data))
        if kind == "DELETED":
            break
    w.stop()
    kinds = [k for k, _ in seen]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED"
    assert ("MODIFIED", {"a": "1", "b": "2"}) in seen
    assert ("MODIFIED", {"b": "2"}) in seen


def test_garbage_collector_deletes_dependents(k8s_api: client.ApiClient, k8s_namespace: str):
    core = client.CoreV1Api(k8s_api)
    owner = core.create_namespaced_config_map(
        k8s_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    core.create_namespaced_config_map(
        k8s_namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref])),
    )
    core.delete_namespaced_config_map("owner", k8s_namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_config_map("dependent", k8s_namespace)
        except ApiException as e:
            return e.status == 404
        return False

    eventually(gone, timeout=60, what="kube-controller-manager's GC to delete the dependent")

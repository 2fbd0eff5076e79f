"""A mutating admission webhook served on loopback over TLS changes a pod at CREATE."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .certs import CertAuthority
from .harness import Cluster
from .util import eventually

LABEL = "datalane.io/mutated"


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, object]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        req = body["request"]
        self.server.seen.append(req)  # type: ignore[attr-defined]
        pod = req["object"]
        patch: list[dict[str, object]] = []
        if not pod["metadata"].get("labels"):
            patch.append({"op": "add", "path": "/metadata/labels", "value": {}})
        patch.append(
            {"op": "add", "path": "/metadata/labels/" + LABEL.replace("/", "~1"), "value": "true"}
        )
        patch.append(
            {
                "op": "add",
                "path": "/spec/containers/0/env",
                "value": [
                    *pod["spec"]["containers"][0].get("env", []),
                    {"name": "INJECTED_BY_WEBHOOK", "value": "yes"},
                ],
            }
        )
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": req["uid"],
                "allowed": True,
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
            },
        }
        out = json.dumps(review).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook_server(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, bytes]]:
    # Its own CA, independent of the cluster's: the caBundle is what makes the apiserver trust it.
    ca = CertAuthority("datalane-test-webhook-ca")
    cert, key = ca.issue("webhook", ip_addresses=["127.0.0.1"]).write(
        tmp_path / "tls.crt", tmp_path / "tls.key"
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.seen = []  # type: ignore[attr-defined]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server, ca.cert_pem
    finally:
        server.shutdown()
        server.server_close()


def test_mutating_webhook_changes_pod_at_create(
    k8s_cluster: Cluster,
    k8s_api: client.ApiClient,
    k8s_namespace: str,
    webhook_server: tuple[ThreadingHTTPServer, bytes],
):
    server, ca_pem = webhook_server
    port = server.server_address[1]
    name = f"datalane-test-{k8s_namespace}"
    adm = client.AdmissionregistrationV1Api(k8s_api)
    adm.create_mutating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "pods.mutate.datalane.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": base64.b64encode(ca_pem).decode(),
                    },
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": k8s_namespace}
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }
    )
    core = client.CoreV1Api(k8s_api)

    def pod(pod_name: str) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=pod_name),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x:1")]),
        )

    try:
        # The apiserver picks the configuration up through its informer: probe with dry runs.
        def mutated_dry_run() -> bool:
            p = core.create_namespaced_pod(k8s_namespace, pod("probe"), dry_run="All")
            return (p.metadata.labels or {}).get(LABEL) == "true"

        eventually(mutated_dry_run, timeout=30, what="webhook registration to take effect")

        created = core.create_namespaced_pod(k8s_namespace, pod("mutated"))
        assert created.metadata.labels[LABEL] == "true"
        env = {e.name: e.value for e in created.spec.containers[0].env}
        assert env["INJECTED_BY_WEBHOOK"] == "yes"
        stored = core.read_namespaced_pod("mutated", k8s_namespace)
        assert stored.metadata.labels[LABEL] == "true"
        reqs = [r for r in server.seen if r["name"] == "mutated"]  # type: ignore[attr-defined]
        assert reqs and reqs[0]["operation"] == "CREATE"
        assert reqs[0]["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    finally:
        adm.delete_mutating_webhook_configuration(name)

    # failurePolicy Fail is honoured: a webhook that is down blocks creation.
    adm.create_mutating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name + "-down"},
            "webhooks": [
                {
                    "name": "down.mutate.datalane.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 2,
                    "clientConfig": {
                        "url": "https://127.0.0.1:1/mutate",
                        "caBundle": base64.b64encode(ca_pem).decode(),
                    },
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": k8s_namespace}
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }
    )
    try:

        def rejected() -> bool:
            try:
                core.create_namespaced_pod(k8s_namespace, pod("blocked"), dry_run="All")
            except ApiException as e:
                return "down.mutate.datalane.io" in e.body
            return False

        eventually(rejected, timeout=30, what="a down webhook to block pod creation")
    finally:
        adm.delete_mutating_webhook_configuration(name + "-down")

"""The webhook TLS Secret: created, or renewed when expiring or missing a name (hook Job).

Runs in the Helm pre-install/pre-upgrade hook Job with its own ServiceAccount, allowed to
get, create and update Secrets in the release namespace only. An existing valid Secret is
kept, so upgrades do not change the CA in the webhook configurations.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from datalane_operator.certs import make_bundle, needs_renewal

__all__ = ["ensure_tls_secret"]


def ensure_tls_secret(namespace: str, name: str, hosts: Iterable[str]) -> str:
    """Make sure Secret ``namespace/name`` holds a CA and a valid serving certificate."""
    from kubernetes import client, config  # type: ignore[import-untyped]
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    core = client.CoreV1Api()
    hosts = list(hosts)
    current = None
    try:
        current = core.read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status != 404:
            raise
    cert = None
    if current is not None and current.data and "tls.crt" in current.data:
        cert = base64.b64decode(current.data["tls.crt"])
    why = needs_renewal(cert, hosts)
    if why is None:
        return f"Secret {namespace}/{name} is valid; kept"
    bundle = make_bundle(hosts)
    data = {k: base64.b64encode(v).decode() for k, v in bundle.secret_data().items()}
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "datalane-operator"}},
            "data": data}
    if current is None:
        core.create_namespaced_secret(namespace, body)
        return f"Secret {namespace}/{name} created"
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    core.replace_namespaced_secret(name, namespace, body)
    return f"Secret {namespace}/{name} renewed ({why})"

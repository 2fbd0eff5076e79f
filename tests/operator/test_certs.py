"""Webhook TLS: the CA and serving certificate work for a real TLS handshake; the hook Job's
Secret is created once and kept while valid."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cryptography import x509
from datalane_operator.certs import make_bundle, needs_renewal, service_names

from tests.cluster.harness import Cluster

HOSTS = [*service_names("dl-datalane", "datalane-system"), "127.0.0.1"]


def test_handshake_with_the_ca(tmp_path: Path) -> None:
    bundle = make_bundle(HOSTS)
    ca, crt, key = bundle.write(tmp_path)
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(crt, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.sendall(b"ok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client_ctx = ssl.create_default_context(cafile=str(ca))
    for host in ("127.0.0.1",):
        with socket.create_connection(("127.0.0.1", port)) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=host) as tls:
            assert tls.recv(2) == b"ok"
    t.join(5)
    listener.close()
    # the Service's DNS name is in it too (what the API server checks in a cluster)
    cert = x509.load_pem_x509_certificate(bundle.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dl-datalane.datalane-system.svc" in sans.get_values_for_type(x509.DNSName)


def test_renewal_rules() -> None:
    bundle = make_bundle(HOSTS)
    assert needs_renewal(bundle.cert_pem, HOSTS) is None
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    assert needs_renewal(bundle.cert_pem, HOSTS, now=later).startswith("expires ")
    assert needs_renewal(bundle.cert_pem, ["other.svc"]) == "not valid for other.svc"
    assert needs_renewal(None, HOSTS) == "no certificate"
    assert needs_renewal(b"garbage", HOSTS).startswith("unreadable certificate")


def test_certs_command_writes_files(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "datalane_operator", "certs", "--out",
                          str(tmp_path), "--host", "127.0.0.1"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert {p.name for p in tmp_path.iterdir()} == {"ca.crt", "tls.crt", "tls.key"}


@pytest.mark.cluster
def test_hook_secret_is_created_then_kept(k8s_cluster: Cluster, k8s_namespace: str) -> None:
    cmd = [sys.executable, "-m", "datalane_operator", "certs", "--secret", "tls",
           "--namespace", k8s_namespace, "--service", "dl-datalane"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=k8s_cluster.env,
                           check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"Secret {k8s_namespace}/tls created"
    data = k8s_cluster.kubectl("get", "secret", "tls", "-n", k8s_namespace, "-o",
                               "jsonpath={.data.ca\\.crt}").stdout
    second = subprocess.run(cmd, capture_output=True, text=True, env=k8s_cluster.env,
                            check=False)
    assert second.stdout.strip() == f"Secret {k8s_namespace}/tls is valid; kept"
    again = k8s_cluster.kubectl("get", "secret", "tls", "-n", k8s_namespace, "-o",
                                "jsonpath={.data.ca\\.crt}").stdout
    assert again == data and base64.b64decode(data).startswith(b"-----BEGIN CERTIFICATE")
    kind = k8s_cluster.kubectl("get", "secret", "tls", "-n", k8s_namespace, "-o",
                               "jsonpath={.type}").stdout
    assert kind == "kubernetes.io/tls"

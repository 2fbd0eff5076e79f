"""Webhook TLS: a CA and a serving certificate, made with ``cryptography``.

``datalane-operator certs`` (the Helm hook Job) keeps them in a ``kubernetes.io/tls`` Secret
(``tls.crt``, ``tls.key``, ``ca.crt``) that the operator mounts; the operator copies ``ca.crt``
into the webhook configurations' ``caBundle``. For a local run the same functions write files.
kopf's own self-signed generator is not used: it needs OpenSSL features some hosts lack, and
a CA separate from the leaf lets the leaf be renewed without touching the ``caBundle``.

Pure functions (no I/O besides :meth:`TLSBundle.write`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["TLSBundle", "make_bundle", "needs_renewal", "service_names"]

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class TLSBundle:
    """PEM bytes of a CA certificate, a serving certificate and its key."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def write(self, folder: Path) -> tuple[Path, Path, Path]:
        """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (mode 0600) into ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        ca, crt, key = folder / "ca.crt", folder / "tls.crt", folder / "tls.key"
        ca.write_bytes(self.ca_pem)
        crt.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return ca, crt, key

    def secret_data(self) -> dict[str, bytes]:
        return {"ca.crt": self.ca_pem, "tls.crt": self.cert_pem, "tls.key": self.key_pem}


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names an in-cluster Service is reached by."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca,
                         content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, encipher_only=False,
                         decipher_only=False)


def make_bundle(hosts: Iterable[str], common_name: str = "datalane-operator",
                now: dt.datetime | None = None) -> TLSBundle:
    """A new CA and a serving certificate for ``hosts`` (DNS names and/or IP addresses)."""
    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{common_name}-ca")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=CA_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_usage(True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    leaf = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return TLSBundle(
        ca.public_bytes(pem), leaf.public_bytes(pem),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))


def needs_renewal(cert_pem: bytes | None, hosts: Iterable[str],
                  now: dt.datetime | None = None) -> str | None:
    """Why a serving certificate must be replaced (missing, expiring, wrong names), or None."""
    if not cert_pem:
        return "no certificate"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        return f"unreadable certificate: {e}"
    now = now or dt.datetime.now(dt.UTC)
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no subject alternative names"
    have = {str(n.value) for n in sans}
    missing = [h for h in hosts if h not in have]
    return f"not valid for {', '.join(missing)}" if missing else None

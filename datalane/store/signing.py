"""HMAC signatures of manifests: a ledger that a writer without the key cannot forge.

The hash chain of manifests (:mod:`datalane.store.audit`) proves that a store's history is
consistent, not who wrote it: anyone who may write the bucket can rebuild every manifest and
every link. With a **ledger key** configured, the store also writes, *before* each manifest,
``steps/<step>/MANIFEST.sig``::

    {"format": "datalane.manifest-signature/v1", "step": 30, "key_id": "<16 hex>",
     "hmac_sha256": "<HMAC-SHA256(key, 'datalane.manifest/v1' NUL manifest bytes)>"}

The manifest bytes are unchanged (readers without a key, and older datalane versions, see
the same store), racing committers with the same key write the same signature, and a crash
between the two writes leaves a signature without a manifest: an uncommitted step, as
before. ``datalane audit --key FILE`` requires a valid signature on every manifest.

The key comes from ``DATALANE_LEDGER_KEY_FILE`` (a path: a Kubernetes Secret mounted as a
file) or ``DATALANE_LEDGER_KEY`` (the key itself); trailing newlines are not part of it and it
must hold at least 16 bytes. ``key_id`` is a one-way digest of the key, so an audit can tell
"signed with another key" from "forged". The threat model is in docs/checkpoint-format.md.

Pure functions except the key readers. Callers: :mod:`datalane.store.store`, ``datalane
audit``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

from datalane.spec.errors import ConfigError
from datalane.store.podstate import canonical_json

__all__ = [
    "LEDGER_KEY_ENV",
    "LEDGER_KEY_FILE_ENV",
    "MIN_KEY_BYTES",
    "SIGNATURE_FORMAT",
    "check_key",
    "check_key_file_mode",
    "document_signature_problem",
    "key_id",
    "ledger_key_from_env",
    "read_ledger_key",
    "sign_document",
    "sign_manifest",
    "signature_problem",
]

SIGNATURE_FORMAT = "datalane.manifest-signature/v1"
LEDGER_KEY_ENV = "DATALANE_LEDGER_KEY"
LEDGER_KEY_FILE_ENV = "DATALANE_LEDGER_KEY_FILE"
MIN_KEY_BYTES = 16
_DOMAIN = b"datalane.manifest/v1\0"  # a signature of a manifest is never valid for another use


def check_key(key: bytes, where: str) -> bytes:
    """``key`` if it is long enough to sign with; ConfigError naming ``where`` otherwise."""
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        size = len(key) if isinstance(key, bytes) else type(key).__name__
        raise ConfigError(f"the ledger key from {where} has {size} bytes; use at least "
                          f"{MIN_KEY_BYTES} (e.g. `head -c 32 /dev/urandom | base64`)")
    return key


def check_key_file_mode(path: str, mode: int, owner: int, me: int) -> None:
    """Refuse a key file others may read, as ssh refuses a private key: any permission for
    others, group write or execute, and group read of a file the process itself owns.

    Group read is allowed on a file another user owns: that is how Kubernetes mounts a Secret
    for a non-root container (owned by root, group the pod's ``fsGroup``, mode 0440 - the
    kubelet adds group read to any ``defaultMode`` when ``fsGroup`` is set)."""
    loose = mode & 0o037 or (mode & 0o040 and owner == me)
    if not loose:
        return
    who = "others" if mode & 0o007 else "its group"
    raise ConfigError(
        f"the ledger key file {path} has mode {mode & 0o777:04o}: {who} may read or change "
        f"it, and whoever reads the key can sign anything; make it readable by its owner "
        f"only: chmod 600 {path} (a Kubernetes Secret: defaultMode 0400, or 0440 with the "
        f"pod's fsGroup)")


def read_ledger_key(path: str) -> bytes:
    """The ledger key in the file ``path`` (trailing newlines stripped); ConfigError naming
    the path when it cannot be read or its mode lets others read it
    (:func:`check_key_file_mode`)."""
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if os.name == "posix":
                check_key_file_mode(path, info.st_mode, info.st_uid, os.geteuid())
            key = f.read().rstrip(b"\r\n")
    except OSError as e:
        raise ConfigError(f"cannot read the ledger key file {path}: {e.strerror or e}") from e
    return check_key(key, f"the file {path}")


def ledger_key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The ledger key named by the environment, or None when neither variable is set."""
    env = os.environ if environ is None else environ
    path, value = env.get(LEDGER_KEY_FILE_ENV), env.get(LEDGER_KEY_ENV)
    if path and value:
        raise ConfigError(f"both {LEDGER_KEY_FILE_ENV} and {LEDGER_KEY_ENV} are set; set one")
    if path:
        return read_ledger_key(path)
    if value:
        return check_key(value.encode().rstrip(b"\r\n"), f"${LEDGER_KEY_ENV}")
    return None


def key_id(key: bytes) -> str:
    """A short one-way name of ``key`` (it reveals nothing that helps to guess the key)."""
    return hashlib.sha256(b"datalane ledger key id\0" + key).hexdigest()[:16]


def _mac(key: bytes, manifest: bytes) -> str:
    return hmac.new(key, _DOMAIN + manifest, hashlib.sha256).hexdigest()


def sign_manifest(key: bytes, step: int, manifest: bytes) -> bytes:
    """The bytes of ``MANIFEST.sig`` for the manifest bytes ``manifest`` of ``step``."""
    doc = {"format": SIGNATURE_FORMAT, "step": step, "key_id": key_id(key),
           "hmac_sha256": _mac(key, manifest)}
    return canonical_json(doc) + b"\n"


def signature_problem(key: bytes, step: int, manifest: bytes, signature: bytes | None,
                      uri: str) -> str | None:
    """Why the signature ``uri`` does not vouch for ``manifest`` (None when it does)."""
    if signature is None:
        return (f"the manifest is not signed: {uri} does not exist (committed without a "
                f"ledger key, or the signature was deleted)")
    try:
        doc = json.loads(signature)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return f"the signature {uri} is not valid JSON"
    if not isinstance(doc, dict) or doc.get("format") != SIGNATURE_FORMAT:
        return f"the signature {uri} is not a {SIGNATURE_FORMAT} document"
    if doc.get("step") != step:
        return f"the signature {uri} is for step {doc.get('step')!r}, not {step}"
    mac = doc.get("hmac_sha256")
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, manifest)):
        if doc.get("key_id") != key_id(key):
            return (f"the signature {uri} was made with another key (key id "
                    f"{doc.get('key_id')!r}, the audit's key is {key_id(key)}), or forged")
        return (f"the signature {uri} does not match the manifest's bytes: the manifest was "
                f"forged or altered after it was signed")
    return None


def _document_mac(key: bytes, domain: str, doc: Mapping[str, Any]) -> str:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return hmac.new(key, domain.encode() + b"\0" + canonical_json(body),
                    hashlib.sha256).hexdigest()


def sign_document(key: bytes | None, domain: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with ``"signature": {"key_id", "hmac_sha256"}`` over its other keys' canonical
    JSON (``domain``, the document's format, keeps a signature from serving another kind of
    document); ``doc`` unchanged without a key. For the store's own records (HEAD.json, gc
    records), which are small JSON documents rather than bytes signed beside them."""
    out = {k: v for k, v in doc.items() if k != "signature"}
    if key is not None:
        out["signature"] = {"key_id": key_id(key), "hmac_sha256": _document_mac(key, domain, out)}
    return out


def document_signature_problem(key: bytes, domain: str, doc: Mapping[str, Any],
                               uri: str) -> str | None:
    """Why ``doc``'s signature does not vouch for it under ``key`` (None when it does)."""
    sig = doc.get("signature")
    if sig is None:
        return f"{uri} is not signed (written without a ledger key)"
    mac = sig.get("hmac_sha256") if isinstance(sig, dict) else None
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _document_mac(key, domain, doc)):
        if isinstance(sig, dict) and sig.get("key_id") != key_id(key):
            return (f"{uri} was signed with another key (key id {sig.get('key_id')!r}, the "
                    f"audit's key is {key_id(key)}), or forged")
        return f"{uri} does not match its signature: it was forged or altered after it was signed"
    return None

"""The checkpoint store as the operator sees it: storage options, listing and garbage collection.

:func:`sidecar_store_options` is what the injected sidecar gets in ``DATALANE_STORE_OPTIONS``
(no credentials: those reach the sidecar as environment variables from the Secret).
:func:`operator_store_options` adds the credentials the operator read from the same Secret,
in memory only; it refuses a Secret without the keys, since the store's client would
otherwise fall back to the operator's own identity (which the cluster policy,
:mod:`datalane_operator.policy`, must allow first). :class:`StoreView` lists committed steps
and garbage-collects through :class:`datalane.store.CheckpointStore` (blocking I/O: the
handlers call it in a thread).

Credentials never leave this module in any form but an fsspec options mapping: they are not
logged, not put in events, not written to the status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import ConfigError
from datalane_operator.pipeline import CheckpointSpec

__all__ = [
    "DEFAULT_PROTOCOLS",
    "SECRET_SCHEMES",
    "Listing",
    "StoreView",
    "ledger_key_of",
    "operator_store_options",
    "scheme_of",
    "sidecar_store_options",
]

# Secret keys the operator understands, per URI scheme, and the fsspec option each becomes.
_S3_KEYS = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_SESSION_TOKEN": "token"}
_S3_REQUIRED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
SECRET_SCHEMES = ("s3",)
"""Schemes whose credentials the operator takes from ``spec.checkpoint.secretRef``."""
DEFAULT_PROTOCOLS = ("file", "memory", "s3", "s3a", "gs", "gcs")
"""URI schemes the stock sidecar image reads: fsspec's built-ins, s3fs (``datalane[sidecar]``)
and gcsfs (``images/sidecar/requirements.txt``). The chart declares the list
(``sidecar.protocols``) and passes it to the operator, whose admission warns about any other
scheme in a recipe or a checkpoint URI."""


def scheme_of(uri: str) -> str:
    """The URI's scheme (``file`` for a plain absolute path)."""
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def sidecar_store_options(ckpt: CheckpointSpec) -> dict[str, Any]:
    """fsspec options for the sidecar (endpoint and region only; credentials come from the
    environment, or from the pod spec's references when the data has its own Secret)."""
    scheme = scheme_of(ckpt.uri)
    if ckpt.region is not None and scheme != "s3":
        raise ConfigError(f"spec.checkpoint.region is set, but spec.checkpoint.uri "
                          f"{ckpt.uri!r} is not an s3:// URI")
    if ckpt.endpoint is None and ckpt.region is None:
        return {}
    if scheme == "s3":
        kwargs = {"endpoint_url": ckpt.endpoint, "region_name": ckpt.region}
        return {"client_kwargs": {k: v for k, v in kwargs.items() if v is not None}}
    if scheme in ("gs", "gcs"):
        return {"endpoint_url": ckpt.endpoint}
    raise ConfigError(f"spec.checkpoint.endpoint is set, but spec.checkpoint.uri "
                      f"{ckpt.uri!r} is not an s3:// or gs:// URI")


def operator_store_options(ckpt: CheckpointSpec, secret: Mapping[str, str] | None,
                           ) -> dict[str, Any]:
    """fsspec options for the operator's own listing: the sidecar's plus the Secret's
    credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN`` for S3).

    ``secret`` None means the operator's own identity (the caller checked the policy). A
    Secret for S3 without both keys is a :class:`ConfigError` naming the missing ones.
    """
    options = sidecar_store_options(ckpt)
    if secret is not None and scheme_of(ckpt.uri) == "s3":
        missing = [k for k in _S3_REQUIRED if not secret.get(k)]
        if missing:
            name = ckpt.secretRef.name if ckpt.secretRef else "?"
            raise ConfigError(f"Secret {name!r} (spec.checkpoint.secretRef) has no "
                              f"{' and no '.join(missing)}; the operator acts on "
                              f"{ckpt.uri!r} only with the Secret's credentials: add the "
                              f"keys to the Secret")
        for env, opt in _S3_KEYS.items():
            if secret.get(env):
                options[opt] = secret[env]
    return options


def ledger_key_of(secret: Mapping[str, str] | None) -> bytes | None:
    """The run's ledger key, when the checkpoint Secret holds one as ``DATALANE_LEDGER_KEY``
    (the sidecars read it from there too): the operator signs its gc records with it."""
    value = (secret or {}).get("DATALANE_LEDGER_KEY")
    return value.encode().rstrip(b"\r\n") if value else None


@dataclass(frozen=True)
class Listing:
    """What one look at the store found: committed steps (ascending) after any gc.

    ``denied``: the operator did not touch the store at all, because the cluster policy or
    the Secret does not let it (``error`` says why and what to do)."""

    uri: str
    committed: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    error: str = ""
    denied: bool = False

    @property
    def ok(self) -> bool:
        return not self.error


class StoreView:
    """List and garbage-collect one pipeline's checkpoint store (blocking; run in a thread)."""

    def __init__(self, uri: str, options: Mapping[str, Any] | None = None,
                 retries: int = 2, ledger_key: bytes | None = None) -> None:
        from datalane.store import CheckpointStore

        self.uri = uri
        # the run's ledger key signs the gc records (an audit with the key refuses unsigned
        # ones)
        self._store = CheckpointStore(uri, dict(options or {}) or None, retries=retries,
                                      backoff=0.2, ledger_key=ledger_key)

    def newest(self) -> tuple[int | None, str]:
        """(the newest committed step or None, "") or (None, why the store cannot be read):
        a read-only look, for the admission of a recipe edit."""
        from datalane.spec.errors import DatalaneError

        try:
            committed = self._store.committed_steps()
        except (DatalaneError, OSError) as e:
            return None, f"{type(e).__name__}: {e}"
        return (committed[-1] if committed else None), ""

    def look(self, keep: int, collect: bool = True) -> Listing:
        """List committed steps; with ``collect``, delete those beyond the newest ``keep``.

        Storage errors are returned in ``Listing.error`` (they become a ``Degraded``
        condition), with the message of the library, which names the object, never a key.
        """
        from datalane.spec.errors import DatalaneError

        try:
            deleted = self._store.gc(keep) if collect else []
            committed = self._store.committed_steps()
        except (DatalaneError, OSError) as e:
            return Listing(self.uri, error=f"{type(e).__name__}: {e}")
        return Listing(self.uri, committed, deleted)

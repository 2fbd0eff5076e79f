"""The wire contract between trainer clients and the sidecar: gRPC over a Unix socket.

``datalane.proto`` is the source; ``datalane_pb2*.py`` are generated from it
(``python -m datalane.wire.generate``) and checked for drift by the tests. A microbatch is the
columns of the recipe's sample schema, each a raw little-endian buffer, inline or in a slot of
a shared-memory ring (:mod:`datalane.wire.shm`); the reply to Open announces the schema and
where each column lies (:mod:`datalane.wire.layout`).
"""

from __future__ import annotations

PROTOCOL_VERSION = 2
"""Bumped on any incompatible change; client and sidecar refuse to talk across versions.
1: ``input_ids`` and ``positions`` (int32) only. 2: the typed columns of a sample schema,
announced in the reply to Open."""

NO_SESSION_KEY = "datalane-no-session"
"""Trailing metadata of the NOT_FOUND that means "no such session" (re-open and retry), as
opposed to a checkpoint object that is not found (an error to report, not to retry)."""

STORE_ERROR_KEY = "datalane-store-error"
"""Trailing metadata of a checkpoint that the checkpoint store failed ("transient" or
"permanent"): the sidecar already retried it within its bound, so the client raises it to
the trainer instead of asking again (a sidecar restarting is UNAVAILABLE without it)."""

CLIENT_KEY = "datalane-client"
"""Invocation metadata of Open: which trainer process opens (host, pid and a nonce). The
sidecar refuses an Open that would take a reader away from another process that is streaming
it (tensor-parallel peers that forgot ``readers=``), and never one of the same process (a
reconnect). A client that sends none is never refused for it."""

__all__ = ["CLIENT_KEY", "NO_SESSION_KEY", "PROTOCOL_VERSION", "STORE_ERROR_KEY",
           "protocol_mismatch"]


def protocol_mismatch(client: int, sidecar: int) -> str:
    """What a client and a sidecar of different protocol versions tell their user: both
    versions, and which side to upgrade (the older one)."""
    if client < sidecar:
        fix = ("upgrade the trainer's datalane package to the sidecar's release (or run a "
               "sidecar image of the trainer's release)")
    else:
        fix = ("upgrade the sidecar (its image) to the trainer's datalane release (or pin the "
               "trainer's datalane package to the sidecar's release)")
    return (f"the trainer's client speaks datalane wire protocol {client}, the sidecar speaks "
            f"protocol {sidecar}: {fix}")

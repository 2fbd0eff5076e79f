"""The wire contract between trainer clients and the sidecar: gRPC over a Unix socket.

``datalane.proto`` is the source; ``datalane_pb2*.py`` are generated from it
(``python -m datalane.wire.generate``) and checked for drift by the tests. Payloads are raw
little-endian int32 buffers, inline or in a shared-memory ring (:mod:`datalane.wire.shm`).
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
"""Bumped on any incompatible change; client and sidecar refuse to talk across versions."""

NO_SESSION_KEY = "datalane-no-session"
"""Trailing metadata of the NOT_FOUND that means "no such session" (re-open and retry), as
opposed to a checkpoint object that is not found (an error to report, not to retry)."""

__all__ = ["NO_SESSION_KEY", "PROTOCOL_VERSION"]

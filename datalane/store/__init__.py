"""Checkpoint store: lane resume points in object storage (docs/checkpoint-format.md).

The sidecar writes each pod's lane states per checkpoint step and commits the step; the
operator lists committed steps, reports the latest and garbage-collects; ``datalane audit``
verifies the hash chain, prints the ledger and proves that a recipe amended with phases left
the steps before the change unchanged (:mod:`datalane.store.amendments`). Any fsspec URI
works (``file://``, plain local paths, ``s3://`` through s3fs); ``storage_options`` go to
fsspec unchanged.

Storage layout under the base URI (details in ``docs/checkpoint-format.md``)::

    <base>/steps/<step:012d>/pod-<pod_id>.json   one object per pod per step
    <base>/steps/<step:012d>/MANIFEST.json       the commit marker
    <base>/steps/<step:012d>/MANIFEST.sig        its HMAC signature (with a ledger key)

A step is committed iff its manifest exists and verifies: it lists every lane ``0..L-1``
with the SHA-256 of its state, every pod object with the SHA-256 of its bytes, the ledger of
global batch hashes since the previous checkpoint, and the SHA-256 of the previous manifest.
Writes are atomic (temp file + rename locally, one PUT on object stores); transient errors
are retried and then raised as ``StorageError(transient=True)`` naming the object.

Example::

    store = CheckpointStore("s3://bucket/run-7", {"key": ..., "secret": ...})
    store.write_pod(30, "0", lanes, digests, fp, fp_doc, lanes_total=8)
    store.commit(30)              # Manifest once all pods have written, else None
    ckpt = store.load(store.latest_committed(), lanes=[4, 5, 6, 7])
    store.gc(keep=3)

This package imports only :mod:`datalane.spec`, fsspec and the standard library.
"""

from datalane.store.amendments import Amendment, PhaseStart
from datalane.store.audit import AuditEntry, AuditReport, PhaseRecord
from datalane.store.manifest import MANIFEST_FORMAT, LaneEntry, Manifest
from datalane.store.objects import is_transient
from datalane.store.podstate import POD_STATE_FORMAT
from datalane.store.signing import (
    LEDGER_KEY_ENV,
    LEDGER_KEY_FILE_ENV,
    SIGNATURE_FORMAT,
    ledger_key_from_env,
    read_ledger_key,
)
from datalane.store.store import CheckpointStore, NoCheckpointError

__all__ = [
    "LEDGER_KEY_ENV",
    "LEDGER_KEY_FILE_ENV",
    "MANIFEST_FORMAT",
    "POD_STATE_FORMAT",
    "SIGNATURE_FORMAT",
    "Amendment",
    "AuditEntry",
    "AuditReport",
    "CheckpointStore",
    "LaneEntry",
    "Manifest",
    "NoCheckpointError",
    "PhaseRecord",
    "PhaseStart",
    "is_transient",
    "ledger_key_from_env",
    "read_ledger_key",
]

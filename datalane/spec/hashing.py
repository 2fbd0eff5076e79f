"""The canonical batch hash (docs/architecture.md, Trainers, ranks and readers).

A lane window (its ``B/L`` sequences of one step) hashes as SHA-256 over the little-endian
bytes of its columns in schema order (:mod:`datalane.spec.schema`): for a text recipe,
``input_ids`` then ``positions``, both int32. A vision recipe's per-image columns come last in
the schema: the window's images (``image_seq`` counted from the window's first row,
``image_patch_start`` from 0), their used rows only, so the hash depends neither on slot
capacities nor on how the lanes are dealt to ranks (:mod:`datalane.spec.imagecolumns`).
The global hash of a step is SHA-256 over the concatenated 32-byte lane-window digests in lane
order ``0..L-1``, so any process that knows the lane digests can compute it without holding
the batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np

from datalane.spec.schema import SampleSchema

__all__ = ["global_hash", "window_digest"]


def window_digest(schema: SampleSchema, columns: Mapping[str, np.ndarray]) -> bytes:
    """Digest of one lane window: its columns' bytes in schema order."""
    h = hashlib.sha256()
    for c in schema:
        h.update(np.ascontiguousarray(columns[c.name], dtype=c.np_dtype).data)
    return h.digest()


def global_hash(lane_digests: Iterable[bytes]) -> str:
    """Hex global step hash from the lane-window digests, given in lane order."""
    h = hashlib.sha256()
    for d in lane_digests:
        h.update(d)
    return h.hexdigest()

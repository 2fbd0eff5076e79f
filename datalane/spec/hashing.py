"""The canonical batch hash (DESIGN section 2).

A lane window (its ``B/L`` sequences of one step) hashes as SHA-256 over the little-endian
int32 bytes of its ``input_ids`` followed by its ``positions``. The global hash of a step is
SHA-256 over the concatenated 32-byte lane-window digests in lane order ``0..L-1``, so any
process that knows the lane digests can compute it without holding the batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["global_hash", "window_digest"]

_LE_I32 = np.dtype("<i4")


def window_digest(input_ids: Any, positions: Any) -> bytes:
    """Digest of one lane window; arrays of shape ``(B/L, seq_len+1)``."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(input_ids, dtype=_LE_I32).data)
    h.update(np.ascontiguousarray(positions, dtype=_LE_I32).data)
    return h.digest()


def global_hash(lane_digests: Iterable[bytes]) -> str:
    """Hex global step hash from the lane-window digests, given in lane order."""
    h = hashlib.sha256()
    for d in lane_digests:
        h.update(d)
    return h.hexdigest()

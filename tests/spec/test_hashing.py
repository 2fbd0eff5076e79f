"""The canonical batch hash, computed here by hand with hashlib (docs/architecture.md): a lane
window hashes its columns' little-endian bytes in schema order, the step hashes the lane
digests in lane order."""

from __future__ import annotations

import hashlib

import numpy as np

from datalane.spec.hashing import global_hash, window_digest
from datalane.spec.schema import text_schema


def test_a_window_hashes_its_columns_bytes_in_schema_order_as_their_dtype() -> None:
    """input_ids then positions, both as int32 (whatever type they are given in), and a
    column the schema does not name is not hashed."""
    ids, positions = [5, 6, 1 << 20], [0, 1, 0]
    want = hashlib.sha256(np.array(ids, "<i4").tobytes()
                          + np.array(positions, "<i4").tobytes()).digest()
    columns: dict[str, np.ndarray] = {
        "positions": np.array(positions, np.int64), "input_ids": np.array(ids, np.int64),
        "extra": np.array([9], np.int32)}
    assert window_digest(text_schema(0), columns) == want


def test_the_step_hash_is_over_the_lane_digests_in_lane_order() -> None:
    a, b = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    assert global_hash([a, b]) == hashlib.sha256(a + b).hexdigest()
    assert global_hash([b, a]) != global_hash([a, b])
    assert global_hash([]) == hashlib.sha256(b"").hexdigest()

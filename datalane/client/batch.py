"""The unit a trainer receives: one microbatch of its rank's local batch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Batch"]


@dataclass
class Batch:
    """``input_ids`` and ``positions``: int32 arrays of shape (microbatch, seq_len + 1).

    ``positions`` restart at 0 at each document and each sequence and are -1 on padding.
    ``ended`` is set once every lane of the rank has run out of data (finite recipes).
    The last microbatch of a step carries the window digest of each of the rank's lanes, from
    which the global step hash is composed (``datalane.spec.hashing.global_hash``).
    """

    step: int
    index: int
    input_ids: np.ndarray
    positions: np.ndarray
    ended: bool = False
    lane_digests: dict[int, bytes] = field(default_factory=dict)  # last microbatch of a step

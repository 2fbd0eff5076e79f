"""torch adapter: microbatches as tensors, checkpointable with torch.distributed.checkpoint.

``DataLaneDataset(loader)`` wraps a :class:`~datalane.client.SidecarLoader` or an
:class:`~datalane.client.InProcessLoader` as an ``IterableDataset`` yielding dicts of tensors:

* ``input_ids``  int64 (mb, seq_len): tokens ``0..seq_len-1`` of each sequence
* ``labels``     int64 (mb, seq_len): tokens ``1..seq_len``, ``-100`` where the target is padding
* ``positions``  int64 (mb, seq_len): 0 at every document start, -1 on padding
* ``cu_seqlens`` int32 (segments + 1,): document boundaries over the flattened microbatch, for
  variable-length attention kernels (each padding run is a segment of its own)

It implements ``state_dict()`` / ``load_state_dict()`` as a ``Stateful``: the whole state is a
single JSON string, so ``torch.distributed.checkpoint`` stores it as one small blob.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import IterableDataset

from datalane.client.batch import Batch

__all__ = ["DataLaneDataset", "cu_seqlens", "to_tensors"]

IGNORE_INDEX = -100


class _Loader(Protocol):
    def __iter__(self) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def cu_seqlens(positions: np.ndarray) -> np.ndarray:
    """Segment boundaries of a (rows, cols) positions array, flattened row-major."""
    flat = positions.reshape(-1)
    n = flat.size
    start = np.zeros(n, dtype=bool)
    start[0] = True
    start[1:] = (flat[1:] == 0) | ((flat[1:] < 0) & (flat[:-1] >= 0))
    cols = positions.shape[1]
    start[::cols] = True  # every sequence starts a segment
    return np.append(np.flatnonzero(start), n).astype(np.int32)


def to_tensors(batch: Batch) -> dict[str, torch.Tensor]:
    ids = torch.from_numpy(np.ascontiguousarray(batch.input_ids, dtype=np.int64))
    pos = np.ascontiguousarray(batch.positions[:, :-1])
    labels = ids[:, 1:].clone()
    labels[torch.from_numpy(batch.positions[:, 1:] < 0)] = IGNORE_INDEX
    return {
        "input_ids": ids[:, :-1].contiguous(),
        "labels": labels,
        "positions": torch.from_numpy(pos.astype(np.int64)),
        "cu_seqlens": torch.from_numpy(cu_seqlens(pos)),
    }


class DataLaneDataset(IterableDataset[dict[str, torch.Tensor]]):
    """An ``IterableDataset`` over a datalane loader; use it with ``batch_size=None``."""

    def __init__(self, loader: _Loader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch in self.loader:
            yield to_tensors(batch)

    def state_dict(self) -> dict[str, Any]:
        return {"datalane": json.dumps(self.loader.state_dict(), separators=(",", ":"))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(json.loads(state["datalane"]))

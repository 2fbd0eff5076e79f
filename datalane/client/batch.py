"""The unit a trainer receives: one microbatch of its rank's local batch, as named columns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from datalane.spec.schema import SampleSchema, TextColumns

__all__ = ["Batch"]


@dataclass
class Batch(TextColumns):
    """``columns``: the recipe's sample columns in schema order, numpy arrays of shape
    (microbatch, seq_len + 1) (a per-sequence column: (microbatch,)), each of its own dtype.

    Every recipe has ``input_ids`` and ``positions`` (int32; also the properties of the same
    names): ``positions`` restart at 0 at each document and each sequence and are -1 on
    padding. A chat recipe adds ``loss_mask`` (uint8: 1 where the trainer learns the token). A
    vision recipe adds ``loss_mask`` and the per-image columns of the microbatch's images
    (``image_patches``, ``image_grid_thw``, ``image_seq``, ``image_offset``,
    ``image_patch_start``; :mod:`datalane.spec.imagecolumns`), whose row counts vary.
    ``schema`` is the recipe's :class:`~datalane.spec.schema.SampleSchema` (the loaders set
    it: the sidecar announces it, the in-process mode has the engine's). ``ended`` is set
    once every lane of the rank has run out of data (finite recipes). The last microbatch of
    a step carries the window digest of each of the rank's lanes, from which the global step
    hash is composed (``datalane.spec.hashing.global_hash``).

    ``step_tokens`` is the number of trained next-token targets in the rank's whole step
    (every microbatch of the step carries the same count): targets that are not padding and,
    with a ``loss_mask``, have mask 1 - exactly the torch adapter's labels that are not -100
    (:mod:`datalane.spec.targets`). Summed over the data-parallel ranks it is the global
    count a loss normalized over the global batch divides by (the torch adapter's
    ``global_tokens``). A rank that owns fewer lanes than others ends each step with fully
    padded microbatches (no trained target), so every rank yields as many per step.
    """

    step: int
    index: int
    columns: dict[str, np.ndarray]
    ended: bool = False
    lane_digests: dict[int, bytes] = field(default_factory=dict)  # last microbatch of a step
    schema: SampleSchema | None = None
    step_tokens: int = 0

    def __post_init__(self) -> None:
        if self.schema is not None and tuple(self.columns) != self.schema.names:
            raise ValueError(f"a batch with the columns {list(self.columns)} does not match "
                             f"its schema's {list(self.schema.names)}")

    @property
    def nbytes(self) -> int:
        """Payload bytes: every column."""
        return sum(a.nbytes for a in self.columns.values())

    def copy(self) -> Batch:
        """A batch owning copies of its columns (zero-copy views live only until the next
        microbatch with ``copy=False``)."""
        return Batch(self.step, self.index, {k: a.copy() for k, a in self.columns.items()},
                     self.ended, dict(self.lane_digests), self.schema, self.step_tokens)

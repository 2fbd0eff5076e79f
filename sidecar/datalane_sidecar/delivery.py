"""One Stream message's microbatches, taken from a session and placed for its reader.

:func:`gather` takes the reader's next ready microbatches (up to :data:`MAX_PER_DELIVERY`,
as far as free shared-memory slots or an inline size budget allow: one message per
microbatch is what costs the most), copies each into a slot of the reader's ring (or packs
it into inline buffers) and returns small :class:`Sent` records: what the gRPC message says
about each one. It runs where the session lives: in the server process
(:class:`~datalane_sidecar.service.DataLaneService` with ``--rank-processes 0``) or in the
rank's worker process (:mod:`datalane_sidecar.worker`), which then sends only the records
over its pipe: the payload is already in the ring the client maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from datalane.spec.errors import StorageError
from datalane.wire.shm import ShmWriter

if TYPE_CHECKING:
    from datalane_sidecar.session import Session

__all__ = ["INLINE_DELIVERY_BYTES", "MAX_PER_DELIVERY", "RingClosed", "Sent", "gather"]

MAX_PER_DELIVERY = 16  # microbatches in one Stream message
INLINE_DELIVERY_BYTES = 1 << 20  # inline payload in one Stream message (bigger ones wait)


class RingClosed(StorageError):
    """The reader's ring closed while a microbatch waited for a free slot (its handle was
    closed or replaced, or the sidecar is stopping)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


@dataclass
class Sent:
    """What a Stream message says about one microbatch (its payload is in ``slot`` at
    ``offset`` of the ring, or in ``columns``)."""

    step: int
    index: int
    rows: int
    ended: bool
    step_tokens: int
    state_json: str  # the step's checkpoint, on its last microbatch; else ""
    lane_digests: dict[int, bytes] = field(default_factory=dict)
    slot: int | None = None
    offset: int = 0
    columns: list[bytes] | None = None  # inline buffers, in schema order
    nbytes: int = 0
    tokens: int = 0  # positions >= 0 (trained tokens, for the metrics)
    depth: int = 0  # microbatches ready for the reader after this one


def gather(session: Session, reader: int, generation: int, ring: ShmWriter | None,
           timeout: float) -> list[Sent]:
    """The reader's next ready microbatches, placed (at least one unless none became ready
    within ``timeout``, or no slot became free). Raises the producer's error (after the
    microbatches made before it) and :class:`RingClosed`."""
    out: list[Sent] = []
    budget = INLINE_DELIVERY_BYTES
    while len(out) < MAX_PER_DELIVERY and (ring is not None or budget > 0):
        wait = timeout if not out else 0.0
        slot = None
        if ring is not None:
            # a free slot first: an item is taken from the session only once it has a place
            slot = ring.acquire(timeout=wait)
            if slot is None:
                if ring.closed and not out:
                    raise RingClosed(f"session {session.id} was closed while it waited for a "
                                     f"free shared-memory slot")
                break
        try:
            item = session.next(reader, generation, timeout=wait)
        except BaseException:
            if slot is not None:
                ring.release([slot])  # type: ignore[union-attr]
            if out:
                break  # the error is raised again on the next call
            raise
        if item is None:
            if slot is not None:
                ring.release([slot])  # type: ignore[union-attr]
            break
        sent = Sent(item.step, item.index, item.rows, item.ended, item.step_tokens,
                    session.texts.text(item.after) if item.after is not None else "",
                    dict(item.lane_digests), nbytes=item.nbytes,
                    tokens=int(np.count_nonzero(item.columns["positions"] >= 0)),
                    depth=session.queue_depth(reader))
        if ring is not None and slot is not None:
            try:
                sent.slot, sent.offset = slot, ring.write(slot, item.columns)
            except ValueError as e:  # mmap closed or invalid: closed after the slot was taken
                if not ring.closed:
                    raise
                raise RingClosed(f"session {session.id} was closed while a microbatch was "
                                 f"written to its shared-memory slot") from e
        else:
            sent.columns = session.layout.pack(item.columns)
        budget -= item.nbytes
        out.append(sent)
    return out

"""delivery.gather when the reader's ring closes under it: a stream of a replaced or closed
handle ends as RingClosed (ABORTED to the client), never as a raw ``mmap closed`` error
(UNKNOWN), whichever moment the ring closes at."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from datalane_sidecar.delivery import RingClosed, gather
from datalane_sidecar.session import Prepared


class _Ring:
    """A ring whose close lands between the slot's acquire and the write (as a re-open of the
    reader closes the old handle's ring from another thread)."""

    def __init__(self) -> None:
        self.closed = False

    def acquire(self, timeout: float) -> int | None:
        return None if self.closed else 0

    def release(self, slots: list[int]) -> None:
        pass

    def write(self, slot: int, columns: dict[str, np.ndarray]) -> int:
        self.closed = True  # closed by the re-open meanwhile: the mapping is gone
        raise ValueError("mmap closed or invalid")


def _session() -> SimpleNamespace:
    item = Prepared(0, 0, {"positions": np.arange(4, dtype=np.int32)}, False, None, {})
    return SimpleNamespace(id="s1", next=lambda reader, generation, timeout: item,
                           queue_depth=lambda reader: 0, texts=None)


def test_a_ring_closed_while_its_slot_is_written_ends_the_stream_as_closed() -> None:
    with pytest.raises(RingClosed, match="session s1 was closed while a microbatch was written"):
        gather(_session(), 0, 1, _Ring(), timeout=0.0)  # type: ignore[arg-type]


def test_a_write_error_of_an_open_ring_is_not_taken_for_a_close() -> None:
    ring = _Ring()
    ring.write = lambda slot, columns: (_ for _ in ()).throw(ValueError("bad columns"))  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="bad columns"):
        gather(_session(), 0, 1, ring, timeout=0.0)  # type: ignore[arg-type]

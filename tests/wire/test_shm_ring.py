"""The shared-memory ring's slots (datalane/wire/shm.py): which slot the writer hands out,
which releases count, what closing does, and which slot offsets a reader refuses, by hand on
48-byte slots (1 row of 3 tokens of the wire tests' schema)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from datalane.spec.errors import MismatchError
from datalane.spec.schema import Column, text_schema
from datalane.wire.layout import Layout
from datalane.wire.shm import ShmReader, ShmWriter

LAYOUT = Layout.of(text_schema(7, extra=(Column("loss_mask", "uint8", 0, default=1),
                                         Column("doc_count", "int64", 0, per_token=False))),
                   1, 3)


def _columns(first: int) -> dict[str, np.ndarray]:
    ids = np.array([[first, first + 1, first + 2]], dtype=np.int32)
    return {"input_ids": ids, "positions": ids * 0, "loss_mask": np.ones((1, 3), np.uint8),
            "doc_count": np.array([first], dtype=np.int64)}


@pytest.fixture
def writer(tmp_path: Path):
    w = ShmWriter(str(tmp_path / "ring"), slots=3, layout=LAYOUT)
    yield w
    w.close()


def test_slots_are_handed_out_in_order_and_reused_in_release_order(writer) -> None:
    """A fresh ring of 3 hands out 0, 1, 2; released 2 then 0, they come back as 2, 0."""
    assert LAYOUT.slot_bytes == 48 and writer.size == 144 and writer.free_slots() == 3
    assert [writer.acquire(timeout=0) for _ in range(3)] == [0, 1, 2]
    assert writer.free_slots() == 0 and writer.acquire(timeout=0) is None
    writer.release([2, 0])
    assert writer.free_slots() == 2
    assert [writer.acquire(timeout=0), writer.acquire(timeout=0)] == [2, 0]


def test_a_release_of_a_free_or_unknown_slot_is_ignored(writer) -> None:
    """A client that releases a slot twice, or names one outside 0..2, frees nothing more."""
    assert writer.acquire(timeout=0) == 0
    writer.release([0, 0, 3, -1])
    assert writer.free_slots() == 3
    assert [writer.acquire(timeout=0) for _ in range(3)] == [1, 2, 0]


def test_a_slot_outside_the_ring_is_not_written(writer) -> None:
    """write() takes slots 0..2 only (slot 2 at byte 96), naming the bad slot."""
    assert writer.write(2, _columns(5)) == 96
    for slot in (3, -1):
        with pytest.raises(ValueError, match=rf"^slot {slot} is outside the ring's 3 slots$"):
            writer.write(slot, _columns(5))


def test_closing_wakes_a_waiting_acquire_and_refuses_later_ones(writer) -> None:
    """A producer waiting for a slot gets None when the ring closes (not a slot, not a hang);
    so does every acquire after, free slots or not; the file is removed."""
    for _ in range(3):
        writer.acquire(timeout=0)
    got: list[int | None] = []
    t = threading.Thread(target=lambda: got.append(writer.acquire(timeout=30)), daemon=True)
    t.start()
    writer.close()
    t.join(10)
    assert not t.is_alive() and got == [None] and writer.closed
    writer.release([0])
    assert writer.acquire(timeout=0) is None
    assert not Path(writer.path).exists()


def test_a_release_wakes_a_waiting_acquire(writer) -> None:
    """A producer waiting for a slot gets the one released, without waiting out its
    timeout."""
    for _ in range(3):
        writer.acquire(timeout=0)
    got: list[int | None] = []
    t = threading.Thread(target=lambda: got.append(writer.acquire(timeout=30)), daemon=True)
    t.start()
    writer.release([1])
    t.join(10)
    assert not t.is_alive() and got == [1]


def test_the_reader_counts_whole_slots_and_refuses_a_ring_smaller_than_one(writer) -> None:
    """A 144-byte ring of 48-byte slots has 3; 100 bytes hold 2; 47 bytes not one."""
    assert ShmReader(writer.path, 144, LAYOUT).slots == 3
    assert ShmReader(writer.path, 100, LAYOUT).slots == 2
    assert ShmReader(writer.path, 48, LAYOUT).slots == 1
    with pytest.raises(MismatchError, match=r"ring .* of 47 bytes cannot hold one slot of 48"):
        ShmReader(writer.path, 47, LAYOUT)


@pytest.mark.parametrize("offset", [-48, 24, 144])
def test_the_reader_refuses_an_offset_that_is_not_a_slot_of_the_ring(writer, offset) -> None:
    """Slots start at 0, 48 and 96 of a 144-byte ring: not before it, between two, or at
    its end."""
    reader = ShmReader(writer.path, writer.size, LAYOUT)
    with pytest.raises(MismatchError, match=rf"^the sidecar names a slot at byte {offset} of a "
                                            rf"144-byte ring with slots of 48 bytes$"):
        reader.columns(offset)
    reader.close()


def test_the_reader_reads_the_last_slot_of_the_ring(writer) -> None:
    """The slot at byte 96 (ending exactly at 144) is inside the ring."""
    writer.write(2, _columns(5))
    reader = ShmReader(writer.path, writer.size, LAYOUT)
    got = reader.columns(96)
    assert got["input_ids"].tolist() == [[5, 6, 7]] and got["doc_count"].tolist() == [5]
    del got
    reader.close()

"""The committed gRPC stubs are exactly what the proto generates; the shm ring round-trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from datalane.wire.generate import OUTPUTS, ROOT, generate
from datalane.wire.shm import ShmReader, ShmWriter


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    for path in fresh:
        committed = ROOT / "datalane" / "wire" / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale: run `python -m datalane.wire.generate` and commit")
    assert sorted(p.name for p in fresh) == sorted(OUTPUTS)


def test_shm_ring_slots_round_trip_and_wait_for_release(tmp_path: Path) -> None:
    writer = ShmWriter(str(tmp_path / "ring"), slots=2, slot_bytes=2 * 4 * 6)
    reader = ShmReader(writer.path, writer.size)
    ids = np.arange(6, dtype=np.int32).reshape(2, 3)
    pos = -ids
    a = writer.acquire(timeout=1)
    b = writer.acquire(timeout=1)
    assert {a, b} == {0, 1}
    assert writer.acquire(timeout=0.05) is None  # full until the reader releases
    off = writer.write(a, ids, pos)
    got_ids, got_pos = reader.arrays(off, 2, 3)
    assert np.array_equal(got_ids, ids) and np.array_equal(got_pos, pos)
    assert not got_ids.flags.writeable
    writer.release([a])
    assert writer.acquire(timeout=1) == a
    reader.close()
    writer.close()
    assert not Path(writer.path).exists()

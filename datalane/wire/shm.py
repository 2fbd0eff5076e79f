"""A shared-memory ring of fixed-size slots for microbatch payloads.

The sidecar creates the ring as a file in the socket's ``emptyDir`` (a ``tmpfs`` when the
volume's medium is Memory) and writes each microbatch's ``input_ids`` then ``positions`` into a
free slot; the gRPC message names the slot. The trainer maps the same file read-only and makes
numpy views of the slot, then acknowledges the slot so the sidecar can reuse it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading

import numpy as np

__all__ = ["ShmReader", "ShmWriter"]


class ShmWriter:
    """The sidecar's side: owns the file, hands out free slots, copies payloads in."""

    def __init__(self, path: str, slots: int, slot_bytes: int, mode: int = 0o600) -> None:
        """``mode``: the file's permissions, the socket's (0660 lets a trainer of another
        user in the pod's group map it; the umask does not apply)."""
        self.path = path
        self.slots = slots
        self.slot_bytes = slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, slots * slot_bytes)
            self._map = mmap.mmap(fd, slots * slot_bytes)
        finally:
            os.close(fd)
        self._free = list(range(slots))
        self._cond = threading.Condition()
        self._closed = False

    @property
    def size(self) -> int:
        return self.slots * self.slot_bytes

    def free_slots(self) -> int:
        with self._cond:
            return len(self._free)

    @property
    def closed(self) -> bool:
        return self._closed

    def acquire(self, timeout: float | None = None) -> int | None:
        """A free slot, waiting for the client to release one; None on timeout or close."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free or self._closed, timeout):
                return None
            if self._closed:
                return None
            return self._free.pop(0)

    def write(self, slot: int, *arrays: np.ndarray) -> int:
        """Copy ``arrays`` back to back into ``slot``; returns the slot's byte offset."""
        offset = slot * self.slot_bytes
        at = offset
        for a in arrays:
            data = np.ascontiguousarray(a, dtype="<i4")
            n = data.nbytes
            if at + n > offset + self.slot_bytes:
                raise ValueError(f"payload of {at + n - offset} bytes exceeds the slot size "
                                 f"{self.slot_bytes}")
            self._map[at:at + n] = data.data.cast("B")
            at += n
        return offset

    def release(self, slots: list[int]) -> None:
        with self._cond:
            for s in slots:
                if 0 <= s < self.slots and s not in self._free:
                    self._free.append(s)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        try:
            self._map.close()
        except BufferError:  # a view is still alive; the mapping goes with the process
            pass
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class ShmReader:
    """The trainer's side: a read-only mapping and zero-copy views of slots."""

    def __init__(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    def arrays(self, offset: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, positions)`` views of a slot (valid until the slot is released)."""
        n = rows * cols
        buf = np.frombuffer(self._map, dtype="<i4", count=2 * n, offset=offset)
        return buf[:n].reshape(rows, cols), buf[n:].reshape(rows, cols)

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._map.close()

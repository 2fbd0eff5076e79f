"""A shared-memory ring of fixed-size slots for microbatch payloads.

The sidecar creates the ring as a file in the socket's ``emptyDir`` (a ``tmpfs`` when the
volume's medium is Memory) and writes each microbatch's columns into a free slot, each at its
offset of the announced :class:`~datalane.wire.layout.Layout` (its own dtype: int32 token ids
and positions, a uint8 loss mask, ...); the gRPC message names the slot. The trainer maps the
same file read-only and makes numpy views of the slot's columns by the same layout, then
acknowledges the slot so the sidecar can reuse it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading

import numpy as np

from datalane.spec.errors import MismatchError
from datalane.wire.layout import Layout

__all__ = ["ShmReader", "ShmWriter"]


class ShmWriter:
    """The sidecar's side: owns the file, hands out free slots, copies payloads in."""

    def __init__(self, path: str, slots: int, layout: Layout, mode: int = 0o600) -> None:
        """``mode``: the file's permissions, the socket's (0660 lets a trainer of another
        user in the pod's group map it; the umask does not apply)."""
        self.path = path
        self.slots = slots
        self.layout = layout
        self.slot_bytes = slot_bytes = layout.slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, slots * slot_bytes)
            self._map = mmap.mmap(fd, slots * slot_bytes)
        except BaseException:  # no file is left behind that nobody would remove
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
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

    def write(self, slot: int, columns: dict[str, np.ndarray]) -> int:
        """Copy a microbatch's columns into ``slot`` by the layout; returns the slot's byte
        offset. ValueError if the columns are not the layout's (names, shapes)."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside the ring's {self.slots} slots")
        offset = slot * self.slot_bytes
        self.layout.write(self._map, offset, columns)
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
    """The trainer's side: a read-only mapping and zero-copy views of slots, by the layout
    the sidecar announced."""

    def __init__(self, path: str, size: int, layout: Layout) -> None:
        if size < layout.slot_bytes:
            raise MismatchError(f"the shared-memory ring {path} of {size} bytes cannot hold "
                                f"one slot of {layout.slot_bytes}")
        fd = os.open(path, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.size = size
        self.layout = layout

    @property
    def slots(self) -> int:
        """Slots of the ring (its size over the announced slot size)."""
        return self.size // self.layout.slot_bytes

    def columns(self, offset: int) -> dict[str, np.ndarray]:
        """Read-only views of the columns of the slot at byte ``offset``, in schema order
        (valid until the slot is released). MismatchError if the slot is outside the ring."""
        slot_bytes = self.layout.slot_bytes
        if offset < 0 or offset % slot_bytes or offset + slot_bytes > self.size:
            raise MismatchError(f"the sidecar names a slot at byte {offset} of a "
                                f"{self.size}-byte ring with slots of {slot_bytes} bytes")
        return self.layout.views(self._map, offset)

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._map.close()

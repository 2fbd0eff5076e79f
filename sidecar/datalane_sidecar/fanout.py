"""Microbatches produced once for a session and sent to each of its readers.

With tensor, context or pipeline parallelism several trainer ranks read one data-parallel rank;
they must get byte-identical microbatches, and the sidecar must not compute them twice. A
:class:`Fanout` holds what a session's producer made, numbered from 0 (the session's first
microbatch), and one cursor per declared reader: the next microbatch to send it. The producer
waits while it is ``prefetch`` ahead of the slowest reader. A microbatch is dropped once every
reader was sent past it and, within ``hold`` microbatches of its cursor, its client
acknowledged it too: what was sent but not yet handed to the trainer stays, so a reader whose
stream broke can attach again at its exact position. A reader that has not attached yet counts
as being at 0; a reader that closed counts no more. Each (re-)attachment gets a new
generation, so the stream of a reader that was opened again stops taking microbatches. Used by
:mod:`datalane_sidecar.session` under the session's lock (the ``cond`` passed in).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Fanout", "ReaderSlot"]

T = TypeVar("T")


@dataclass
class ReaderSlot:
    """Where one declared reader stands."""

    cursor: int | None = 0  # next microbatch to send; None: closed (holds nothing back)
    acked: int = 0  # microbatches its client reported handed to the trainer
    generation: int = 0  # bumped at each attachment; 0: never attached
    sent: tuple[int, int] | None = None  # (step, index) of the last microbatch sent
    position: tuple[int, int] | None = None  # (step, consumed) its client reported


class Fanout(Generic[T]):
    """Produced items and the readers' cursors; every method expects ``cond`` held."""

    def __init__(self, readers: int, prefetch: int, hold: int,
                 cond: threading.Condition) -> None:
        self.slots = [ReaderSlot() for _ in range(readers)]
        self.prefetch = prefetch
        self.hold = hold
        self._cond = cond
        self._items: deque[T] = deque()
        self.base = 0  # number of the oldest item held
        self.error: BaseException | None = None  # the producer's; raised after its items

    @property
    def produced(self) -> int:
        return self.base + len(self._items)

    def slowest(self) -> int:
        """The cursor of the slowest reader still counted."""
        cursors = [s.cursor for s in self.slots if s.cursor is not None]
        return min(cursors) if cursors else self.produced

    def _kept_from(self) -> int:
        points = [min(s.cursor, max(s.acked, s.cursor - self.hold))
                  for s in self.slots if s.cursor is not None]
        return min(points) if points else self.produced

    def _drop(self) -> None:
        kept = self._kept_from()
        while self._items and self.base < kept:
            self._items.popleft()
            self.base += 1

    def room(self) -> bool:
        """Whether the producer may add an item (it is less than ``prefetch`` ahead)."""
        return self.produced - self.slowest() < self.prefetch

    def put(self, item: T) -> None:
        self._items.append(item)
        self._drop()
        self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._cond.notify_all()

    def ready(self, reader: int) -> int:
        """Items produced that ``reader`` was not sent yet."""
        cursor = self.slots[reader].cursor
        return 0 if cursor is None else self.produced - cursor

    def take(self, reader: int, generation: int) -> T | None:
        """The reader's next item (and move past it); None if none is ready or the reader
        was attached again since ``generation``. Raises the producer's error once the
        reader was sent everything made before it."""
        slot = self.slots[reader]
        if slot.generation != generation or slot.cursor is None:
            return None
        if slot.cursor >= self.produced:
            if self.error is not None:
                raise self.error
            return None
        item = self._items[slot.cursor - self.base]
        slot.cursor += 1
        self._drop()
        self._cond.notify_all()
        return item

    def attach(self, reader: int, at: int) -> int | None:
        """Point ``reader`` at item ``at``; its new generation, or None if ``at`` was
        dropped already (or is before the session's start)."""
        if at < self.base:
            return None
        slot = self.slots[reader]
        slot.cursor = slot.acked = at
        slot.generation += 1
        slot.sent = slot.position = None
        self._cond.notify_all()
        return slot.generation

    def ack(self, reader: int, generation: int, done: int) -> None:
        """The reader's client handed ``done`` microbatches (counted from 0) to its trainer."""
        slot = self.slots[reader]
        if slot.generation == generation and done > slot.acked:
            slot.acked = done
            self._drop()

    def detach(self, reader: int, generation: int) -> None:
        """The reader's stream closed: it holds nothing back any more."""
        slot = self.slots[reader]
        if slot.generation == generation:
            slot.cursor = None
            self._drop()
            self._cond.notify_all()

    def attached(self) -> list[int]:
        return [k for k, s in enumerate(self.slots) if s.generation and s.cursor is not None]

"""Coalesced work per key: at most one run in progress and one waiting, however many kicks.

The operator reconciles a DataPipeline on every event that concerns it (the pipeline, its
PyTorchJob, each of its pods, a storage look); a burst of pod events must not become a burst
of reconciles, and two reconciles of one pipeline must never run at once (both would patch
its status). :class:`Coalescer` runs ``work(key)`` as one task per key: a kick while that
task runs marks the key as waiting, and the task runs ``work`` once more when it is done,
however many kicks arrived meanwhile. Status is rebuilt from the world each time, so the one
extra run sees everything the kicks were about.

Pure asyncio, with the clock and the event loop injected (:class:`~datalane_operator.runtime.
Runtime` passes its own; the tests pass a fake clock). Used by the runtime for reconciles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

K = TypeVar("K", bound=Hashable)


class Coalescer(Generic[K]):
    """Run ``work(key)`` soon after each :meth:`kick`, coalescing the kicks of one key.

    ``on_done(key, seconds, error)`` is called after each finished run (``error`` is the
    exception it raised, or None); a run cancelled by :meth:`cancel_all` reports nothing. A
    failed run does not stop the next one.
    """

    def __init__(self, work: Callable[[K], Awaitable[None]], *,
                 clock: Callable[[], float],
                 on_done: Callable[[K, float, BaseException | None], None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.work = work
        self.clock = clock
        self.on_done = on_done
        self.loop = loop  # None: the running loop at the first kick
        self.running: dict[K, asyncio.Task[None]] = {}
        self.waiting: set[K] = set()
        self.started = 0  # runs of work begun

    def kick(self, key: K) -> None:
        """Run ``work(key)`` once more after whatever run of it is in progress."""
        self.waiting.add(key)
        if key not in self.running:
            loop = self.loop or asyncio.get_running_loop()
            self.running[key] = loop.create_task(self._drain(key))

    async def _drain(self, key: K) -> None:
        try:
            while key in self.waiting:
                self.waiting.discard(key)
                t0 = self.clock()
                error: BaseException | None = None
                self.started += 1
                try:
                    await self.work(key)
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    error = e
                if self.on_done is not None:
                    self.on_done(key, self.clock() - t0, error)
        finally:
            self.running.pop(key, None)

    def cancel_all(self) -> None:
        """Cancel every run in progress and forget the waiting ones."""
        for task in self.running.values():
            task.cancel()
        self.waiting.clear()

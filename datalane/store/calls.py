"""Store calls on threads of their own, each bounded in time.

A checkpoint store is an object store (fsspec: ``s3://``, ``gs://``) whose endpoint can stop
answering for seconds or for good: a read that never returns, a listing that hangs. The
sidecar and the operator call the store next to work that must go on regardless (the sidecar
serves batches, the operator renews its Lease and patches statuses). :class:`StoreCalls` keeps
the store's calls off the threads that work needs:

* each call runs on one of at most ``threads`` threads of its own (daemon threads, started when
  needed and ended after :data:`IDLE_SECONDS` without a call: a call the store never answers
  does not keep the process from exiting), so a hanging store holds those threads, no other;
* the caller waits at most ``seconds``; past that it gets a transient
  :class:`~datalane.spec.errors.StorageError` naming the store, the call and the limit, and a
  call still queued behind hung ones is dropped, never run.

:meth:`StoreCalls.submit` gives the bare future, for an asyncio caller
(``asyncio.wrap_future``: cancelling the awaiting task drops a call not yet started). Callers:
the sidecar's service and pod checkpoints, the operator's store looks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from datalane.spec.errors import StorageError

__all__ = ["IDLE_SECONDS", "STORE_THREADS", "StoreCalls"]

T = TypeVar("T")
STORE_THREADS = 4  # at most this many store calls run at once; the rest wait their turn
IDLE_SECONDS = 60.0  # a thread without a call this long ends (a new one starts when needed)


class StoreCalls:
    """A bounded pool of threads for the calls to one store (``uri`` names it in errors)."""

    def __init__(self, uri: str, seconds: float, threads: int = STORE_THREADS,
                 name: str = "datalane-store") -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, not {threads}")
        self.uri = uri
        self.seconds = seconds
        self.threads = threads
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn()`` on the pool; its future (cancel it to drop a call not started)."""
        future: Future[T] = Future()
        with self._lock:
            self._queue.put((future, fn))
            if self._idle == 0 and self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._run, daemon=True,
                                 name=f"{self._name}-{self._started}").start()
            else:
                self._idle = max(0, self._idle - 1)  # one idle thread takes this call
        return future

    def __call__(self, what: str, fn: Callable[[], T], seconds: float | None = None) -> T:
        """``fn()``'s result (or its error), waiting at most ``seconds`` (the pool's by
        default); a transient StorageError naming ``what`` (the call, for the message) if
        the store does not answer by then."""
        limit = self.seconds if seconds is None else seconds
        future = self.submit(fn)
        try:
            return future.result(timeout=limit)
        except FutureTimeout:
            future.cancel()  # queued behind hung calls: never run
            raise StorageError(
                f"the checkpoint store {self.uri} did not answer within {limit:g} s to "
                f"{what}; the store may be down or unreachable", transient=True) from None

    def _run(self) -> None:
        while True:
            try:
                future, fn = self._queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:  # a call queued meanwhile is taken first
                    if self._queue.empty():
                        self._idle = max(0, self._idle - 1)
                        self._started -= 1
                        return
                continue
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:  # the caller's to raise
                    future.set_exception(e)
            with self._lock:
                self._idle += 1

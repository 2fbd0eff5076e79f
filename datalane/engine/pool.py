"""The worker pool that map tasks share: the task a consumer needs soonest runs first.

Every lane of a loader (and, in a sidecar, every rank's session) submits its map tasks to one
pool. A first-in-first-out pool would run one lane's read-ahead before another lane's task that
the current step is waiting for, which is what made a restore wait for documents it did not
need yet. Here each task carries ``ahead``: how many documents its stream has queued in front
of it (0 means the consumer reads it next). Workers take the smallest ``ahead`` first, then the
oldest. In steady state every stream's new tasks go to the back at about the same ``ahead``,
which is first in, first out again.

Results do not depend on the order tasks run in: streams consume their tasks in submission
order (docs/architecture.md, One lane).
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from datalane.engine.priority import lower_this_thread

__all__ = ["TaskPool"]

T = TypeVar("T")

_EXIT_JOIN_SECONDS = 30.0
_live: weakref.WeakSet[TaskPool] = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    """Workers are daemon threads (a pool nobody closed never holds the process up), so at
    exit every pool is closed here and its running tasks finish before the interpreter goes
    away: a thread must not be inside the tokenizer's native code when it does."""
    for pool in list(_live):
        pool.shutdown(wait=False, cancel_futures=True)
    for pool in list(_live):
        pool.join(_EXIT_JOIN_SECONDS)


class TaskPool(Executor):
    """``workers`` threads running submitted callables, least ``ahead`` first."""

    def __init__(self, workers: int, name: str = "datalane-map") -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self._name = name
        self._heap: list[tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...],
                               dict[str, Any]]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False
        _live.add(self)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.submit_ahead(0, fn, *args, **kwargs)

    def submit_ahead(self, ahead: int, fn: Callable[..., T], /, *args: Any,
                     **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` after every queued task with a smaller ``ahead``."""
        future: Future[T] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot submit to a pool that was shut down")
            heapq.heappush(self._heap, (ahead, next(self._order), future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, daemon=True,
                                     name=f"{self._name}_{len(self._threads)}")
                self._threads.append(t)
                t.start()
            else:
                self._cv.notify()
        return future

    def _work(self) -> None:
        lower_this_thread()  # bulk work: the threads handing data over come first
        while True:
            with self._cv:
                self._idle += 1
                while not self._heap and not self._closed:
                    self._cv.wait()
                self._idle -= 1
                if not self._heap:
                    return  # closed and drained
                _, _, future, fn, args, kwargs = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # the consumer of the future raises it
                future.set_exception(e)
            else:
                future.set_result(result)
            del future, fn, args, kwargs  # no reference to a finished task's data

    def queued(self) -> int:
        """Tasks waiting for a worker."""
        with self._cv:
            return len(self._heap)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cv:
            self._closed = True
            if cancel_futures:
                for item in self._heap:
                    item[2].cancel()
                self._heap.clear()
            self._cv.notify_all()
        if wait:
            self.join()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the workers of a pool that was shut down to finish their tasks."""
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

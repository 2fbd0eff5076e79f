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

A pool of processes (``TaskPool.of(knobs)`` with the ``map_processes`` knob) runs its map
tasks (:meth:`TaskPool.submit_map`) in one child process per thread
(:mod:`datalane.engine.mapprocs`); its queue and its order are the same.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, TypeVar

from datalane.engine.mapprocs import MapProcess
from datalane.engine.priority import lower_this_thread

if TYPE_CHECKING:
    from collections.abc import Sequence

    from datalane.engine.formats import Format
    from datalane.engine.mapstage import MapResult, MapStage, Record
    from datalane.spec.knobs import Knobs

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
    """``workers`` threads running submitted callables, least ``ahead`` first; with
    ``processes``, each thread runs the map tasks in a child process of its own."""

    def __init__(self, workers: int, name: str = "datalane-map",
                 processes: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self.processes = processes
        self._name = name
        self._local = threading.local()  # a thread's MapProcess
        self._children: list[MapProcess] = []
        self._heap: list[tuple[int, int, Future[Any], Callable[..., Any], tuple[Any, ...],
                               dict[str, Any]]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False
        _live.add(self)

    @classmethod
    def of(cls, knobs: Knobs, name: str = "datalane-map") -> TaskPool:
        """The pool the knobs ask for: ``map_processes`` child processes, else ``workers``
        threads."""
        if knobs.map_processes > 0:
            return cls(knobs.map_processes, name, processes=True)
        return cls(knobs.workers, name)

    def submit_map(self, ahead: int, stage: MapStage, records: Sequence[Record],
                   formats: Sequence[Format], lane: int) -> Future[MapResult]:
        """``stage.run(records, formats, lane)`` after every queued task with a smaller
        ``ahead``: on a worker thread, or in its process."""
        if self.processes:
            return self.submit_ahead(ahead, self._run_in_child, stage, records, formats, lane)
        return self.submit_ahead(ahead, stage.run, records, formats, lane)

    def _run_in_child(self, stage: MapStage, records: Sequence[Record], formats: Sequence[Format],
                      lane: int) -> MapResult:
        child: MapProcess | None = getattr(self._local, "child", None)
        if child is None:
            child = self._local.child = MapProcess()
            with self._cv:
                self._children.append(child)
        return child.run(stage, records, formats, lane)

    def children(self) -> list[MapProcess]:
        """The map processes started so far (one per thread that ran a map task)."""
        with self._cv:
            return list(self._children)

    def describe_children(self) -> list[dict[str, int]]:
        """Each map process's :meth:`~datalane.engine.mapprocs.MapProcess.describe`."""
        return [child.describe() for child in self.children()]

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
        try:
            self._serve()
        finally:
            child = getattr(self._local, "child", None)
            if child is not None:
                child.close()

    def _serve(self) -> None:
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

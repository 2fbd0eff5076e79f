"""The server's side of rank worker processes (``--rank-processes``).

:class:`RankProcesses` starts the workers (:mod:`datalane_sidecar.worker`) with the
``forkserver`` context - a clean process that imported the worker's modules once, so a worker
starts in a fraction of a second and never inherits the server's gRPC threads - and gives
each rank its worker (``rank % N``). :class:`RankWorker` is one worker's pipe: calls from any
thread, answered out of order, and one reader thread that notices the worker's death (EOF on
the pipe: kill -9, OOM). Every call in flight then fails with :class:`WorkerLost`, a transient
StorageError, and the service closes the worker's sessions: their streams end UNAVAILABLE
like a restarting sidecar's, a checkpoint gets "no session", and the client re-opens at its
position (``SidecarLoader``'s reconnect path). The reader thread then closes the pipe's end,
reaps the process and removes the rings the worker was writing (:meth:`RankWorker._release`),
so a dead worker holds nothing of the server's; the next Open of such a rank starts a new
worker.

:class:`RemoteSession` stands for a :class:`~datalane_sidecar.session.Session` that lives in a
worker, with the interface :class:`~datalane_sidecar.service.DataLaneService` uses; what is
fixed at the Open (lanes, layout, steps per step) is kept here, everything else is a call.
:class:`RemoteRing` stands for a reader's shared-memory ring, which the worker writes.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import multiprocessing
import os
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from datalane.engine.plan import Plan
from datalane.spec.errors import DatalaneError, StorageError
from datalane.spec.evals import TRAIN
from datalane.spec.knobs import Knobs
from datalane.spec.state import Checkpoint
from datalane.wire.layout import Layout
from datalane_sidecar import worker as worker_module
from datalane_sidecar.boundaries import CheckpointText
from datalane_sidecar.delivery import Sent

__all__ = ["RankProcesses", "RankWorker", "RemoteRing", "RemoteSession", "WorkerLost"]

log = logging.getLogger("datalane.sidecar")
_EXIT_SECONDS = 5.0  # a worker told to exit gets this long before it is killed


class WorkerLost(StorageError):
    """The rank worker process that held a session exited (killed, out of memory)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


class RankWorker:
    """One worker process and its pipe."""

    def __init__(self, index: int, ctx: Any, plans: bytes, knobs: Knobs, prefetch: int,
                 on_lost: Callable[[RankWorker], None]) -> None:
        self.index = index
        parent, child = ctx.Pipe()
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        try:
            self.process = ctx.Process(target=worker_module.main,
                                       args=(child, plans, knobs, prefetch, level),
                                       name=f"datalane-rank-worker-{index}", daemon=True)
            self.process.start()
        except BaseException:  # a worker that never started leaves no pipe behind
            parent.close()
            raise
        finally:
            child.close()  # the worker's end lives in the worker only: its death is EOF here
        self._pid: int | None = self.process.pid
        self._conn = parent
        self._send = threading.Lock()
        self._lock = threading.Lock()
        self._calls: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)
        self.lost: str | None = None
        self._stopping = False
        self._on_lost = on_lost
        # the rings this worker was asked to write and that are not closed yet (handle ->
        # file): removed here when the worker dies, since it cannot remove them itself
        self._rings: dict[str, str] = {}
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"datalane-rank-worker-{index}-pipe")
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._pid

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` in the worker and return its result (raise its error); raises
        :class:`WorkerLost` if the worker is gone or dies meanwhile."""
        future: Future[Any] = Future()
        with self._lock:
            if self.lost is not None:
                raise WorkerLost(self.lost)
            call = next(self._ids)
            self._calls[call] = future
        try:
            with self._send:
                self._conn.send((call, method, args))
        except (OSError, ValueError):
            self._kill()  # the reader then sees EOF and fails this call with WorkerLost
        return future.result()

    def tell(self, method: str, *args: Any) -> None:
        """A notice: run in order, no answer; nothing if the worker is gone."""
        if self.lost is not None:
            return
        try:
            with self._send:
                self._conn.send((None, method, args))
        except (OSError, ValueError):
            self._kill()

    def _kill(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: reaped and closed
            self.process.kill()

    def _read(self) -> None:
        try:
            self._read_answers()
        finally:
            self._gone()  # whatever ended the reader, no call waits for an answer any more
            self._release()

    def _read_answers(self) -> None:
        while True:
            try:
                call, ok, result = self._conn.recv()
            except (EOFError, OSError):
                self._gone()
                return
            except Exception as e:  # an answer that does not unpickle: the pipe is out of
                # step, nothing later can be trusted; a reader that ended here silently left
                # every call in flight, and every later one, waiting forever
                log.error("rank worker %d: unreadable answer on its pipe: %s", self.index, e)
                self._kill()
                self._gone()
                return
            with self._lock:
                future = self._calls.pop(call, None)
            if future is None:
                continue
            if ok:
                future.set_result(result)
                continue
            try:
                error = worker_module.decode_error(result)
            except Exception:  # raised here, it ended the reader with this call waiting
                error = worker_module.RemoteError(
                    f"rank worker {self.index} answered with an unreadable error: "
                    f"{result!r:.200}")
            future.set_exception(error)

    def _gone(self) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.process.join(1.0)
            code = self.process.exitcode
            how = (f"was killed by signal {-code}" if code is not None and code < 0
                   else f"exited with code {code}" if code is not None else "stopped answering")
            self.lost = (f"the rank worker process {self.index} (pid {self.pid}) {how}; "
                         f"reconnect and re-open at your position")
            calls, self._calls = self._calls, {}
        for future in calls.values():
            future.set_exception(WorkerLost(self.lost))
        if self._stopping:
            return
        log.warning("rank worker lost", extra={"worker": self.index, "pid": self.pid,
                                               "exitcode": code})
        self._on_lost(self)

    def _release(self) -> None:
        """The reader thread's last act, after EOF on the pipe (the worker exited or was
        killed): close the pipe's end, reap the process (its sentinel pipes) and remove the
        rings it was writing. A dead worker that no Open replaced held three descriptors of
        the server and its rings' memory on the pod's tmpfs until the server exited."""
        with self._send, contextlib.suppress(OSError):
            self._conn.close()
        self.process.join(_EXIT_SECONDS)
        if self.process.exitcode is None:  # EOF, yet it does not exit: no use any more
            self._kill()
            self.process.join(_EXIT_SECONDS)
        if self.process.exitcode is not None:
            self.process.close()
        with self._lock:
            rings, self._rings = self._rings, {}
        for path in rings.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def track_ring(self, hid: str, path: str) -> None:
        """Ring ``hid`` (file ``path``) is being made by this worker: removed by
        :meth:`close_ring`, or when the worker dies or stops."""
        with self._lock:
            self._rings[hid] = path

    def close_ring(self, hid: str) -> None:
        """Close ring ``hid``: the worker removes it, or this process if the worker is gone."""
        with self._lock:
            path = self._rings.pop(hid, None)
            lost = self.lost is not None
        if lost:  # nobody else will remove the file
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        else:
            self.tell("close_ring", hid)

    def stop(self) -> None:
        """Tell the worker to exit; kill it if it does not within a few seconds. Returns
        once its pipe is closed, its process reaped and its rings removed."""
        if self._stopping:
            return
        self._stopping = True
        self.tell("exit")
        self._reader.join(_EXIT_SECONDS)
        if self._reader.is_alive():  # still running: killed, its EOF ends the reader
            self._kill()
            self._reader.join(_EXIT_SECONDS)


class RemoteRing:
    """A reader's shared-memory ring, owned and written by the session's worker."""

    def __init__(self, worker: RankWorker, hid: str, path: str, size: int) -> None:
        self.worker, self.hid, self.path, self.size = worker, hid, path, size
        self.closed = False

    def release(self, slots: list[int]) -> None:
        self.worker.tell("release", self.hid, slots)

    def close(self) -> None:
        self.closed = True
        self.worker.close_ring(self.hid)


class RemoteSession:
    """A session that lives in rank worker ``worker`` (see the module's docstring)."""

    def __init__(self, worker: RankWorker, session_id: str, plan: Plan, texts: CheckpointText,
                 stream: str, rank: int, world_size: int, microbatch_size: int,
                 readers: int, skip: int, steps: int | None, start: Checkpoint | None,
                 opened: dict[str, Any]) -> None:
        self.worker = worker
        self.id = session_id
        self.plan = plan
        self.texts = texts
        self.stream, self.rank, self.world_size = stream, rank, world_size
        self.microbatch_size, self.readers, self.steps = microbatch_size, readers, steps
        self.first_step = int(opened["first_step"])
        self.per_step = int(opened["per_step"])
        self.first_skip = skip
        self.lanes = range(*opened["lanes"])
        self.layout = Layout.of(plan.schema, microbatch_size, plan.recipe.sequence_tokens)
        self._start = start
        self.backfilled = threading.Event()
        self.backfilled.set()

    @property
    def is_eval(self) -> bool:
        return self.stream != TRAIN

    @property
    def lost(self) -> str | None:
        return self.worker.lost

    def _call(self, name: str, *args: Any) -> Any:
        return self.worker.call("session", self.id, name, *args)

    def claim(self, reader: int) -> int:
        return int(self._call("claim", reader))

    def attach(self, reader: int, step: int, lanes: dict[int, str], skip: int,
               wait: float = 0.0) -> int | None:
        got = self._call("attach", reader, step, lanes, skip, wait)
        return None if got is None else int(got)

    def detach(self, reader: int, generation: int) -> None:
        self.worker.tell("session", self.id, "detach", reader, generation)

    def sent_to(self, reader: int, generation: int, position: tuple[int, int]) -> None:
        self.worker.tell("session", self.id, "sent_to", reader, generation, position)

    def acked_by(self, reader: int, generation: int, position: tuple[int, int]) -> None:
        self.worker.tell("session", self.id, "acked_by", reader, generation, position)

    def attached(self) -> list[int]:
        return list(self._call("attached"))

    @property
    def acked(self) -> tuple[int, int] | None:
        got = self._call("acked")
        return None if got is None else (int(got[0]), int(got[1]))

    @property
    def sent(self) -> tuple[int, int] | None:
        got = self._call("sent")
        return None if got is None else (int(got[0]), int(got[1]))

    def queue_depth(self, reader: int | None = None) -> int:
        return int(self._call("queue_depth", reader))

    def exhausted(self, reader: int) -> bool:
        return bool(self._call("exhausted", reader))

    def state_at(self, step: int, timeout: float = 60.0) -> str:
        return str(self._call("state_at", step, timeout))

    def digests_between(self, start: int, stop: int) -> dict[int, dict[int, bytes]]:
        return dict(self._call("digests_between", start, stop))

    def forget_before(self, step: int) -> None:
        self._call("forget_before", step)

    def describe(self) -> dict[str, Any]:
        return dict(self._call("describe"))

    def gauges(self) -> dict[str, Any]:
        return dict(self._call("gauges"))

    def new_ring(self, hid: str, path: str, slots: int, mode: int) -> RemoteRing:
        # tracked first: a worker that dies while it makes the file still has it removed
        self.worker.track_ring(hid, path)
        try:
            self.worker.call("ring", self.id, hid, path, slots, mode)
        except BaseException:
            self.worker.close_ring(hid)
            raise
        return RemoteRing(self.worker, hid, path, slots * self.layout.slot_bytes)

    def gather(self, reader: int, generation: int, ring: RemoteRing | None,
               timeout: float) -> list[Sent]:
        hid = ring.hid if ring is not None else None
        return list(self.worker.call("gather", self.id, hid, reader, generation, timeout))

    def backfill(self, since: int, load: Callable[[], Checkpoint]) -> None:
        """As :meth:`Session.backfill`: the committed checkpoint is loaded here (the server
        holds the store), the digests are rebuilt in the worker."""
        if since >= self.first_step or self._start is None:
            return
        self.backfilled.clear()

        def run() -> None:
            try:
                self.worker.call("backfill", self.id, since, load())
            except Exception as e:  # the next manifest then shows the gap; audit reports it
                log.warning("cannot rebuild the ledger of steps %d-%d for rank %d: %s",
                            since, self.first_step - 1, self.rank, e)
            finally:
                self.backfilled.set()

        threading.Thread(target=run, daemon=True, name=f"backfill-{self.id}").start()

    def close(self) -> None:
        if self.worker.lost is None:
            with contextlib.suppress(DatalaneError):
                self.worker.call("close", self.id)


class RankProcesses:
    """``count`` rank worker processes; rank ``r``'s sessions live in worker ``r % count``."""

    def __init__(self, count: int, plans: dict[str, Plan], knobs: Knobs, prefetch: int,
                 on_lost: Callable[[RankWorker], None]) -> None:
        self.count = count
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["datalane_sidecar.worker"])
        self._plans = pickle.dumps(plans, protocol=pickle.HIGHEST_PROTOCOL)
        self._knobs, self._prefetch = knobs, prefetch
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self.restarts = 0
        self.workers: list[RankWorker] = []
        # before multiprocessing's own exit hook, which would SIGTERM them (ignored: the
        # server drains them) and wait forever: a server that fails after starting them (its
        # socket cannot be bound) must still exit
        atexit.register(self.stop)
        try:
            for i in range(count):
                self.workers.append(self._start(i))
        except BaseException:  # the ones started are not left running (nor their pipes)
            self.stop()
            raise

    def _start(self, index: int) -> RankWorker:
        return RankWorker(index, self._ctx, self._plans, self._knobs, self._prefetch,
                          self._on_lost)

    def worker_for(self, rank: int) -> RankWorker:
        """Rank ``rank``'s worker; a new one if the last one was lost."""
        index = rank % self.count
        with self._lock:
            worker = self.workers[index]
            if worker.lost is not None:
                worker = self.workers[index] = self._start(index)
                self.restarts += 1
                log.info("rank worker started again", extra={"worker": index,
                                                             "pid": worker.pid})
            return worker

    def open(self, session_id: str, plan: Plan, texts: CheckpointText, stream: str, rank: int,
             world_size: int, microbatch_size: int, start: Checkpoint | None, skip: int,
             readers: int, steps: int | None) -> RemoteSession:
        worker = self.worker_for(rank)
        opened = worker.call("open", session_id, stream, rank, world_size, microbatch_size,
                             start, skip, readers, steps)
        return RemoteSession(worker, session_id, plan, texts, stream, rank, world_size,
                             microbatch_size, readers, skip, steps, start, opened)

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each live worker's pid and resident bytes, and its map processes' (with
        ``--map-processes``), by worker index (the Stats call)."""
        out = {}
        for w in list(self.workers):
            with contextlib.suppress(DatalaneError):
                entry: dict[str, Any] = {"pid": w.pid or 0, "rss_bytes": int(w.call("rss"))}
                if self._knobs.map_processes:
                    entry["map_processes"] = list(w.call("map_processes"))
                out[str(w.index)] = entry
        return out

    def stop(self) -> None:
        """Stop every worker (each gets a few seconds, then SIGKILL); again: nothing."""
        for w in list(self.workers):
            w.stop()

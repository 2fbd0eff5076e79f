"""A rank worker process: the sessions of some data-parallel ranks, away from the server's GIL.

With ``--rank-processes N`` the sidecar runs each rank's sessions (its training session and
its eval sessions) in one of N worker processes (rank ``r`` in worker ``r % N``), each with
its own map pool: the map stages, chat rendering, packing and window copies of different
ranks no longer share one interpreter lock. The server process keeps gRPC, the checkpoint
store, the metrics and admission; it talks to a worker over one pipe
(:class:`~datalane_sidecar.remote.RankWorker`) in small messages - per Stream message the
microbatches' steps, sizes, slots and, on a step's last microbatch, its checkpoint text. The
worker writes the payloads itself into each reader's shared-memory ring (it owns the
:class:`~datalane.wire.shm.ShmWriter`); an inline reader's buffers travel over the pipe.

A message is ``(call, method, args)``. ``call`` None is a notice with no reply, run at once
and in order on the receiving thread (a ring's released slots, a reader's acknowledged
position, a detach); any other is run on a thread of the worker's and answered with
``(call, True, result)`` or ``(call, False, error)`` (:func:`encode_error`). The worker exits
when the pipe closes (the server stopped or was killed: nothing else would end it) or on
``exit``; it ignores SIGTERM and SIGINT, which are the server's to handle (the server drains
the workers' sessions itself). Started by :class:`~datalane_sidecar.remote.RankProcesses`
with the ``forkserver`` context, never forked from the server's gRPC threads.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec import errors
from datalane.spec.knobs import Knobs
from datalane.spec.state import Checkpoint
from datalane.wire.shm import ShmWriter
from datalane_sidecar.boundaries import CheckpointText
from datalane_sidecar.delivery import RingClosed
from datalane_sidecar.logs import setup_logging
from datalane_sidecar.session import Session

__all__ = ["RemoteError", "decode_error", "encode_error", "main"]

log = logging.getLogger("datalane.sidecar")

# what the server may ask of a session by name (``session`` calls), and which are attributes
_METHODS = frozenset({"claim", "attach", "detach", "attached", "sent_to", "acked_by",
                      "reader_positions", "queue_depth", "kept_boundaries", "state_at",
                      "digests_between", "forget_before", "exhausted", "describe", "gauges"})
_PROPERTIES = frozenset({"acked", "sent"})
_NOTICES = frozenset({"detach", "sent_to", "acked_by"})  # session methods sent as notices
_ERRORS: dict[str, type[errors.DatalaneError]] = {
    c.__name__: c for c in (errors.DatalaneError, errors.ConfigError, errors.DataError,
                            errors.StorageError, errors.MismatchError, RingClosed)}


class RemoteError(RuntimeError):
    """An error of a worker process that is not one of datalane's (its type in the text)."""


def encode_error(error: BaseException) -> tuple[str, str, bool]:
    """(type name, message, transient): what crosses the pipe for a raised error."""
    return type(error).__name__, str(error), bool(getattr(error, "transient", False))


def decode_error(data: tuple[str, str, bool]) -> BaseException:
    """The error :func:`encode_error` described: datalane's own types come back as
    themselves (a StorageError keeps ``transient``), any other as :class:`RemoteError`."""
    name, message, transient = data
    cls = _ERRORS.get(name)
    if cls is RingClosed:
        return RingClosed(message)
    if cls is errors.StorageError:
        return errors.StorageError(message, transient=transient)
    if cls is not None:
        return cls(message)
    return RemoteError(f"{name}: {message}")


class _Worker:
    def __init__(self, conn: Connection, plans: dict[str, Plan], knobs: Knobs,
                 prefetch: int) -> None:
        self.conn = conn
        self.plans = plans
        self.texts = {name: CheckpointText(plan) for name, plan in plans.items()}
        self.knobs = knobs
        self.prefetch = prefetch
        self.pool = TaskPool.of(knobs)
        self.sessions: dict[str, Session] = {}
        self.rings: dict[str, ShmWriter] = {}
        self._lock = threading.Lock()
        self._send = threading.Lock()
        # calls block (a microbatch not ready yet, a boundary being computed): one thread
        # each, as many as the server's RPC threads can ask at once for this worker's ranks
        self._calls = ThreadPoolExecutor(max_workers=512, thread_name_prefix="datalane-call")
        self._handlers: dict[str, Callable[..., Any]] = {
            "open": self._open, "session": self._session, "ring": self._ring,
            "release": self._release, "close_ring": self._close_ring, "gather": self._gather,
            "backfill": self._backfill, "close": self._close, "rss": _rss_bytes,
            "map_processes": self.pool.describe_children}

    def serve(self) -> None:
        while True:
            try:
                call, method, args = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the server is gone: its sessions with it
            if method == "exit":
                break
            if call is None:
                try:
                    self._handlers[method](*args)
                except Exception as e:  # a notice has nobody to answer
                    log.warning("rank worker: notice %s failed: %s", method, e)
            else:
                self._calls.submit(self._answer, call, method, args)
        for sid in list(self.sessions):
            self._close(sid)
        for hid in list(self.rings):  # the server closes them first; none is left behind
            self._close_ring(hid)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _answer(self, call: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            reply: tuple[Any, ...] = (call, True, self._handlers[method](*args))
        except BaseException as e:
            reply = (call, False, encode_error(e))
        with self._send:
            try:
                self.conn.send(reply)
            except (OSError, ValueError):
                os._exit(0)

    # -- calls -------------------------------------------------------------------------------
    def _open(self, hid: str, stream: str, rank: int, world_size: int, microbatch_size: int,
              start: Checkpoint | None, skip: int, readers: int,
              steps: int | None) -> dict[str, Any]:
        session = Session(hid, self.plans[stream], self.pool, self.knobs, rank, world_size,
                          microbatch_size, start, skip, self.prefetch, readers,
                          self.texts[stream], stream, steps)
        with self._lock:
            self.sessions[hid] = session
        return {"first_step": session.first_step, "per_step": session.per_step,
                "lanes": (session.lanes.start, session.lanes.stop)}

    def _get(self, sid: str) -> Session:
        with self._lock:
            session = self.sessions.get(sid)
        if session is None:
            raise errors.StorageError(f"session {sid} is closed in its rank worker",
                                      transient=True)
        return session

    def _session(self, sid: str, name: str, *args: Any) -> Any:
        if name in _PROPERTIES:
            return getattr(self._get(sid), name)
        if name not in _METHODS:
            raise errors.ConfigError(f"a rank worker serves no session call {name!r}")
        if name in _NOTICES and sid not in self.sessions:
            return None  # closed meanwhile: nothing to record
        return getattr(self._get(sid), name)(*args)

    def _ring(self, sid: str, hid: str, path: str, slots: int, mode: int) -> None:
        ring = self._get(sid).new_ring(hid, path, slots, mode)
        with self._lock:
            self.rings[hid] = ring

    def _release(self, hid: str, slots: list[int]) -> None:
        ring = self.rings.get(hid)
        if ring is not None:
            ring.release(slots)

    def _close_ring(self, hid: str) -> None:
        with self._lock:
            ring = self.rings.pop(hid, None)
        if ring is not None:
            ring.close()

    def _gather(self, sid: str, hid: str | None, reader: int, generation: int,
                timeout: float) -> list[Any]:
        ring = None
        if hid is not None:
            ring = self.rings.get(hid)
            if ring is None:
                raise RingClosed(f"the shared-memory ring of handle {hid} was closed")
        return self._get(sid).gather(reader, generation, ring, timeout)

    def _backfill(self, sid: str, since: int, start: Checkpoint) -> None:
        """Rebuild the ledger from ``start`` (the committed step ``since``, loaded by the
        server, which holds the store); returns once the rebuild ended."""
        session = self._get(sid)
        session.backfill(since, lambda: start)
        session.backfilled.wait()

    def _close(self, sid: str) -> None:
        with self._lock:
            session = self.sessions.pop(sid, None)
        if session is not None:
            session.close()


def _rss_bytes() -> int:
    """The worker's resident memory now (for the docs' per-rank figures)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(conn: Connection, plans: bytes, knobs: Knobs, prefetch: int,
         log_level: str = "info") -> None:
    """The worker process's entry (``plans``: the pickled plans by stream name, planned once
    by the server; ``log_level``: the server's, its JSON lines go to the same stderr)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(log_level)  # credentials of the environment redacted, as the server's
    _Worker(conn, pickle.loads(plans), knobs, prefetch).serve()

"""Map tasks in processes of their own: decode, render and tokenize past one interpreter lock.

With the ``map_processes`` knob at N > 0 the shared pool (:mod:`datalane.engine.pool`) runs N
threads, and each owns one child process: it sends the child a map task (the stage, once per
child, then the records, the files' formats and the lane) and waits for the
:class:`~datalane.engine.mapstage.MapResult`. The thread waits in a system call, without the
interpreter lock, so what the parent's lock serializes shrinks from the whole map stage (JSON
parsing, chat template renders, taking the ids out of the tokenizer's encodings: a third of a
chat recipe's work) to pickling the records and the results. Measured in docs/benchmarks.md,
Map processes.

The data cannot change: a stage is stateless (:class:`~datalane.engine.mapstage.MapStage`), the
child runs the same code on the same records, and results are consumed in submission order
whichever thread or process ran them.

A child that dies (killed for memory, ``kill -9``) is replaced and the task sent again: a map
task has no side effects, so running it twice is the same as once. The loss is logged (a
warning of ``datalane.engine``) and counted (:meth:`MapProcess.describe`). A task that kills a
fresh child too is the records' fault (a decoder crashing on them): the stream fails with
:class:`MapProcessError` naming the records' files and positions, never waits.

The child is a fresh interpreter (``sys.executable``, the parent's ``sys.path``), started by the
thread that owns it, so it inherits that thread's scheduling priority
(:mod:`datalane.engine.priority`); a child that cannot start (it ends before it says it is
ready) is a :class:`MapProcessError` of its own. It ignores SIGINT and SIGTERM and exits when
its socket closes: when the pool shuts down, or when the parent dies (the kernel closes the
parent's end).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from datalane.spec.errors import DatalaneError

if TYPE_CHECKING:
    from datalane.engine.formats import Format
    from datalane.engine.mapstage import MapResult, MapStage, Record

__all__ = ["MapProcess", "MapProcessError", "serve"]

log = logging.getLogger("datalane.engine")

_ATTEMPTS = 2  # a fresh child, then the stream fails: a task that kills two is its records'
_EXIT_SECONDS = 5.0
_PROTOCOL = pickle.HIGHEST_PROTOCOL  # 5: numpy arrays as one buffer each
_READY = b"ready"

_keys_lock = threading.Lock()
_keys: weakref.WeakKeyDictionary[MapStage, int] = weakref.WeakKeyDictionary()
_next_key = [0]


class MapProcessError(DatalaneError):
    """A map task's process died running it, twice, or the task could not be sent."""


def _key_of(stage: MapStage) -> int:
    """A number naming ``stage`` in every child, for as long as it lives here."""
    with _keys_lock:
        key = _keys.get(stage)
        if key is None:
            key = _keys[stage] = _next_key[0]
            _next_key[0] += 1
        return key


def _rss_of(pid: int) -> int:
    """Resident bytes of a live process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _records_named(records: Sequence[Record]) -> str:
    """Where a task's records are: the files' indexes and the first and last positions."""
    files = sorted({file for file, _, _ in records})
    first, last = records[0][:2], records[-1][:2]
    return (f"{len(records)} records of file(s) {files} (file {first[0]} position {first[1]} "
            f"to file {last[0]} position {last[1]})")


class MapProcess:
    """One child process running map tasks for the one thread that owns it (not thread-safe:
    each pool thread has its own)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        #: stage key -> the stage (weakly): the stages this child holds; a dead one is dropped
        #: there with the next task
        self._sent: dict[int, weakref.ref[MapStage]] = {}
        self.started = 0  # children started so far (a replaced one counts again)
        self.lost = 0  # children that died running a task

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def describe(self) -> dict[str, int]:
        """Its pid (0: none running), resident bytes, children started and children lost
        (the sidecar's Stats call)."""
        pid = self.pid or 0
        return {"pid": pid, "rss_bytes": _rss_of(pid) if pid else 0,
                "started": self.started, "lost": self.lost}

    def run(self, stage: MapStage, records: Sequence[Record], formats: Sequence[Format],
            lane: int = 0) -> MapResult:
        """``stage.run(records, formats, lane)``, in the child."""
        key = _key_of(stage)
        for attempt in range(1, _ATTEMPTS + 1):
            if self._conn is None:
                self._start()
            drop = [k for k, ref in self._sent.items() if ref() is None]
            ship = None if key in self._sent else stage
            try:
                message = pickle.dumps((key, ship, drop, records, formats, lane),
                                       protocol=_PROTOCOL)
            except Exception as e:
                raise MapProcessError(f"a map task of {_records_named(records)} cannot be sent "
                                      f"to a map process: {type(e).__name__}: {e}") from e
            try:
                assert self._conn is not None
                self._conn.send_bytes(message)
                for k in drop:
                    del self._sent[k]
                self._sent[key] = weakref.ref(stage)
                answer = self._conn.recv_bytes()
            except (EOFError, OSError):
                pid = self.pid
                how = self._lost()
                self.lost += 1
                if attempt == _ATTEMPTS:
                    raise MapProcessError(
                        f"the map process died {how} running {_records_named(records)}, in a "
                        f"fresh process too: a decoder or renderer crashes on these records") \
                        from None
                # never silent: an OOM kill would look like nothing
                log.warning("map process %s died %s running %s: a fresh one runs the task "
                            "again", pid, how, _records_named(records))
                continue
            try:
                status, value = pickle.loads(answer)
            except Exception as e:
                raise MapProcessError(f"the map process's answer for {_records_named(records)} "
                                      f"cannot be read: {type(e).__name__}: {e}") from e
            if status == "ok":
                return value  # type: ignore[no-any-return]
            raise value
        raise AssertionError("unreachable")

    def _start(self) -> None:
        """A fresh child, once it has said it is ready (its imports done): one that cannot
        start is an error of its own, not a task's."""
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, json.dumps(sys.path), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._sent.clear()  # (the only place: a new child holds no stage)
        self.started += 1
        try:
            ready = self._conn.recv_bytes()
        except (EOFError, OSError):
            ready = b""
        if ready != _READY:
            how = self._lost()
            raise MapProcessError(f"a map process could not start: it ended {how} before it "
                                  f"was ready ({sys.executable} -c ...; its error is on the "
                                  f"standard error above)")

    def _lost(self) -> str:
        """End the child (its socket closes, it exits, killed if it does not in time); how it
        ended."""
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return "before it started"
        try:
            code = proc.wait(_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        return f"(signal {-code})" if code < 0 else f"(exit status {code})"

    def close(self) -> None:
        """End the child: its socket closes, it exits (killed if it does not in time)."""
        self._lost()


# The child's command: the parent's import path first, then the loop below.
_CHILD = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
          "from datalane.engine.mapprocs import serve; serve(int(sys.argv[2]))")


def _error_reply(e: Exception) -> bytes:
    """``e`` for the parent to raise: itself if it loads again, else its text."""
    try:
        out = pickle.dumps(("error", e), protocol=_PROTOCOL)
        pickle.loads(out)  # an exception whose __init__ wants other arguments does not load
        return out
    except Exception:
        return pickle.dumps(("error", MapProcessError(
            f"{type(e).__name__}: {e} (raised in a map process)")), protocol=_PROTOCOL)


def serve(fd: int) -> None:
    """The child's loop: map tasks from the socket ``fd`` until it closes.

    It ignores SIGINT and SIGTERM: a Ctrl-C or a signal to the process group reaches the
    parent, which stops (or drains) its work and closes the socket, and then the child ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(fd)
    conn.send_bytes(_READY)
    stages: dict[int, MapStage] = {}
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the pool closed its end, or the parent is gone
        key, ship, drop, records, formats, lane = pickle.loads(data)
        for k in drop:
            stages.pop(k, None)
        if ship is not None:
            stages[key] = ship
        try:
            reply: tuple[str, Any] = ("ok", stages[key].run(records, formats, lane))
            out = pickle.dumps(reply, protocol=_PROTOCOL)
        except Exception as e:
            out = _error_reply(e)
        try:
            conn.send_bytes(out)
        except OSError:
            return
        del data, records, out


"""An answer from a rank worker that cannot be read fails the calls instead of hanging them.

RankWorker's pipe reader noticed only EOFError/OSError. Any other error while receiving an
answer (an answer that does not unpickle: UnpicklingError, AttributeError or ImportError for a
class; a truncated message) ended the reader thread silently: ``lost`` was never set, the
calls in flight and every later call waited forever (no timeout), and the Stream, Checkpoint
and Open RPCs of that worker's ranks hung instead of failing UNAVAILABLE."""

from __future__ import annotations

import itertools
import pickle
import threading
from concurrent.futures import Future
from typing import Any

import pytest
from datalane_sidecar.remote import RankWorker, WorkerLost
from datalane_sidecar.worker import RemoteError


class _Process:
    pid = 4242
    exitcode = None

    def join(self, timeout: float | None = None) -> None:
        return None

    def kill(self) -> None:
        self.exitcode = -9

    def close(self) -> None:
        return None


class _BadPipe:
    """A pipe whose next answer does not unpickle."""

    def __init__(self) -> None:
        self.sent = threading.Event()

    def send(self, message: Any) -> None:
        self.sent.set()

    def recv(self) -> Any:
        self.sent.wait()
        raise pickle.UnpicklingError("invalid load key, '\\x00'.")

    def close(self) -> None:
        return None


def _worker(pipe: Any, lost: list[RankWorker]) -> tuple[RankWorker, threading.Thread]:
    """A RankWorker on ``pipe`` (no process), its pipe reader started."""
    w = RankWorker.__new__(RankWorker)
    w.index, w.process, w._conn = 0, _Process(), pipe
    w._send, w._lock = threading.Lock(), threading.Lock()
    w._calls, w.lost, w._stopping, w._pid, w._rings = {}, None, False, 4242, {}
    w._ids = itertools.count(1)
    w._on_lost = lost.append
    reader = threading.Thread(target=w._read, daemon=True)
    reader.start()
    return w, reader


def _call(w: RankWorker) -> Future[Any]:
    """``w.call("rss")`` on a thread of its own: its outcome."""
    result: Future[Any] = Future()

    def caller() -> None:
        try:
            result.set_result(w.call("rss"))
        except BaseException as e:
            result.set_exception(e)

    threading.Thread(target=caller, daemon=True).start()
    return result


def test_a_reply_that_does_not_unpickle_fails_the_calls_instead_of_hanging() -> None:
    lost: list[RankWorker] = []
    w, reader = _worker(_BadPipe(), lost)
    result = _call(w)
    try:
        with pytest.raises(WorkerLost):
            result.result(timeout=60)
    except TimeoutError:
        pytest.fail("the call still waits 60 s after the pipe reader died: it never returns")
    reader.join(10)  # on_lost runs after the futures failed
    assert w.lost is not None and lost == [w]


class _BadErrorPipe(_BadPipe):
    """A pipe whose answer to call 1 is an error :func:`decode_error` cannot read, then EOF."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = False

    def recv(self) -> Any:
        self.sent.wait()
        if self.answered:
            raise EOFError
        self.answered = True
        return (1, False, "not an encoded error")


def test_an_error_answer_that_cannot_be_read_fails_its_call() -> None:
    """decode_error raised on the reader thread after the call's future was taken: the reader
    ended and that call waited forever."""
    w, reader = _worker(_BadErrorPipe(), [])
    result = _call(w)
    try:
        with pytest.raises(RemoteError, match="rank worker 0 answered with an unreadable "
                                              "error: 'not an encoded error'"):
            result.result(timeout=30)
    except TimeoutError:
        pytest.fail("the call still waits 30 s after its answer came: it never returns")
    reader.join(10)

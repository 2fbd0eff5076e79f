"""An answer from a rank worker that cannot be read fails the calls instead of hanging them.

RankWorker's pipe reader noticed only EOFError/OSError. Any other error while receiving an
answer (an answer that does not unpickle: UnpicklingError, AttributeError or ImportError for a
class; a truncated message) ended the reader thread silently: ``lost`` was never set, the
calls in flight and every later call waited forever (no timeout), and the Stream, Checkpoint
and Open RPCs of that worker's ranks hung instead of failing UNAVAILABLE."""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import Future
from typing import Any

import pytest
from datalane_sidecar.remote import RankWorker, WorkerLost


class _Process:
    pid = 4242
    exitcode = None

    def join(self, timeout: float | None = None) -> None:
        return None

    def kill(self) -> None:
        self.exitcode = -9


class _BadPipe:
    """A pipe whose next answer does not unpickle."""

    def __init__(self) -> None:
        self.sent = threading.Event()

    def send(self, message: Any) -> None:
        self.sent.set()

    def recv(self) -> Any:
        self.sent.wait()
        raise pickle.UnpicklingError("invalid load key, '\\x00'.")


def test_a_reply_that_does_not_unpickle_fails_the_calls_instead_of_hanging() -> None:
    w = RankWorker.__new__(RankWorker)
    w.index, w.process, w._conn = 0, _Process(), _BadPipe()
    w._send, w._lock = threading.Lock(), threading.Lock()
    w._calls, w.lost, w._stopping = {}, None, False
    import itertools
    w._ids = itertools.count(1)
    lost: list[RankWorker] = []
    w._on_lost = lost.append
    reader = threading.Thread(target=w._read, daemon=True)
    reader.start()
    result: Future[Any] = Future()

    def caller() -> None:
        try:
            result.set_result(w.call("rss"))
        except BaseException as e:
            result.set_exception(e)

    threading.Thread(target=caller, daemon=True).start()
    try:
        with pytest.raises(WorkerLost):
            result.result(timeout=60)
    except TimeoutError:
        pytest.fail("the call still waits 60 s after the pipe reader died: it never returns")
    reader.join(10)  # on_lost runs after the futures failed
    assert w.lost is not None and lost == [w]

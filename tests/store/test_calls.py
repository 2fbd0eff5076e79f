"""``datalane.store.calls.StoreCalls``: a store's calls on a bounded pool of their own, each
bounded in time (review finding 7). The calls here hang on an Event the test holds, as an
object store's endpoint that stops answering does."""

from __future__ import annotations

import threading
import time

import pytest

from datalane.spec.errors import StorageError
from datalane.store.calls import StoreCalls


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{name}-")]


def test_a_call_that_hangs_fails_transient_naming_the_store_and_the_call() -> None:
    calls = StoreCalls("s3://bucket/run", seconds=0.2, name="test-store")
    hung = threading.Event()
    t0 = time.monotonic()
    try:
        with pytest.raises(StorageError) as e:
            calls("list the committed checkpoints", lambda: hung.wait(60))
        took = time.monotonic() - t0
        assert e.value.transient
        assert str(e.value) == ("the checkpoint store s3://bucket/run did not answer within "
                                "0.2 s to list the committed checkpoints; the store may be "
                                "down or unreachable")
        assert 0.2 <= took < 5
    finally:
        hung.set()


def test_results_and_errors_come_back_to_the_caller() -> None:
    calls = StoreCalls("file:///store", seconds=5, name="test-store")
    assert calls("add", lambda: 2 + 3) == 5
    with pytest.raises(StorageError, match="gone"):
        calls("read", lambda: (_ for _ in ()).throw(StorageError("gone", transient=False)))
    assert calls("fast", lambda: "ok", seconds=1) == "ok"


def test_a_hanging_store_holds_at_most_its_threads_and_queued_calls_never_run() -> None:
    calls = StoreCalls("s3://bucket/run", seconds=0.3, threads=2, name="test-store-bound")
    hung = threading.Event()
    ran: list[int] = []

    def hangs(i: int) -> None:
        ran.append(i)
        hung.wait(60)

    failures = []

    def caller(i: int) -> None:
        try:
            calls(f"read {i}", lambda: hangs(i))
        except StorageError as e:
            failures.append(str(e))

    try:
        callers = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(30)
        assert len(failures) == 8  # every caller got its answer in time
        assert len(ran) == 2  # two threads hung; the six calls queued behind them were dropped
        assert len(_threads("test-store-bound")) == 2
        hung.set()  # the store answers again: the pool serves new calls on the same threads
        time.sleep(0.2)
        assert calls("after", lambda: 42) == 42
        assert sorted(ran) == sorted(set(ran)) and len(ran) == 2
        assert len(_threads("test-store-bound")) == 2
    finally:
        hung.set()


def test_idle_threads_end_and_new_ones_start_when_needed(monkeypatch) -> None:
    monkeypatch.setattr("datalane.store.calls.IDLE_SECONDS", 0.2)
    calls = StoreCalls("file:///store", seconds=5, name="test-store-idle")
    assert calls("first", lambda: 1) == 1
    assert len(_threads("test-store-idle")) == 1
    deadline = time.monotonic() + 10
    while _threads("test-store-idle") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads("test-store-idle") == []
    assert calls("again", lambda: 2) == 2

"""The shared map pool: least ``ahead`` first, then oldest; futures behave like the stdlib's."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from datalane.engine.pool import TaskPool


def _blocked_pool() -> tuple[TaskPool, threading.Event]:
    """A one-worker pool whose worker is held until the returned event is set."""
    pool = TaskPool(1)
    gate = threading.Event()
    started = threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(30)

    pool.submit(hold)
    assert started.wait(30)
    return pool, gate


def test_the_task_with_least_ahead_runs_first_then_the_oldest() -> None:
    pool, gate = _blocked_pool()
    ran: list[str] = []
    futures = [pool.submit_ahead(ahead, ran.append, name)
               for ahead, name in [(512, "lane0-readahead"), (256, "lane1-second"),
                                   (0, "lane1-head"), (512, "lane1-readahead"),
                                   (0, "lane2-head")]]
    gate.set()
    for f in futures:
        f.result(timeout=30)
    assert ran == ["lane1-head", "lane2-head", "lane1-second", "lane0-readahead",
                   "lane1-readahead"]
    pool.shutdown()


def test_errors_reach_the_future_and_the_worker_survives() -> None:
    with TaskPool(2) as pool:
        bad = pool.submit(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            bad.result(timeout=30)
        assert pool.submit(lambda x: x * 2, 21).result(timeout=30) == 42


def test_shutdown_cancels_queued_tasks_and_refuses_new_ones() -> None:
    pool, gate = _blocked_pool()
    queued = pool.submit_ahead(5, lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    assert pool.queued() == 0
    gate.set()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)


def test_a_cancelled_task_is_skipped() -> None:
    pool, gate = _blocked_pool()
    first = pool.submit_ahead(0, lambda: "first")
    second = pool.submit_ahead(1, lambda: "second")
    assert first.cancel()
    gate.set()
    assert second.result(timeout=30) == "second"
    assert first.cancelled()
    pool.shutdown()


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers must be at least 1, not 0"):
        TaskPool(0)


def test_a_pool_nobody_closed_finishes_its_running_task_at_exit(tmp_path) -> None:
    """Workers are daemon threads; at exit the pool is closed and its running task completes
    (never cut off inside native code), and queued tasks are cancelled."""
    done = tmp_path / "done"
    code = f"""
import time
from datalane.engine.pool import TaskPool
pool = TaskPool(1)
def slow():
    time.sleep(0.5)
    open({str(done)!r}, "w").write("finished")
pool.submit(slow)
pool.submit_ahead(9, lambda: open({str(done)!r} + ".queued", "w").write("ran"))
time.sleep(0.1)  # the first task is running; exit without shutting the pool down
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert done.read_text() == "finished"
    assert not (tmp_path / "done.queued").exists()

"""Bulk threads (map workers, block readers, and the threads they start) run niced below the
threads that hand data over; nothing else about them changes."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from datalane.engine import priority
from datalane.engine.docstream import _reads
from datalane.engine.pool import TaskPool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="per-thread nice values are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _expected() -> int:
    return min(19, _nice() + priority.BULK_NICE)


def test_a_map_worker_runs_niced_and_the_caller_does_not_change() -> None:
    mine = _nice()
    with TaskPool(2) as pool:
        got = {pool.submit(_nice).result(timeout=10) for _ in range(8)}
    assert got == {_expected()}
    assert _nice() == mine


def test_a_block_reader_runs_niced() -> None:
    assert _reads().submit(_nice).result(timeout=10) == _expected()


def test_a_thread_a_bulk_thread_starts_inherits_its_nice() -> None:
    """The tokenizer's Rust pool is started by the first tokenizer call, on a map worker: its
    threads inherit the worker's value (Linux copies it to a new thread)."""
    def start_one() -> int:
        out: list[int] = []
        t = threading.Thread(target=lambda: out.append(_nice()))
        t.start()
        t.join()
        return out[0]

    with TaskPool(1) as pool:
        assert pool.submit(start_one).result(timeout=10) == _expected()


def test_lowering_adds_to_the_current_value_and_stops_at_19() -> None:
    def run(by: int) -> tuple[int, int | None, int]:
        before = _nice()
        said = priority.lower_this_thread(by)
        return before, said, _nice()

    def in_thread(by: int) -> tuple[int, int | None, int]:
        out: list[tuple[int, int | None, int]] = []
        t = threading.Thread(target=lambda: out.append(run(by)))
        t.start()
        t.join()
        return out[0]

    before, said, after = in_thread(3)
    assert said == after == min(19, before + 3)
    before, said, after = in_thread(40)
    assert said == after == 19
    before, said, after = in_thread(0)
    assert said is None and after == before


def test_elsewhere_the_thread_keeps_its_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(priority.sys, "platform", "darwin")
    out: list[object] = []

    def run() -> None:
        before = _nice()
        out.extend([priority.lower_this_thread(), before, _nice()])

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out[0] is None and out[1] == out[2]


def test_a_refused_change_leaves_the_thread_running(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise PermissionError("seccomp")

    monkeypatch.setattr(priority.os, "setpriority", refuse)
    with TaskPool(1) as pool:
        assert pool.submit(lambda: 6 * 7).result(timeout=10) == 42

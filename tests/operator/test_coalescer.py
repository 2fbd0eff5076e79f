"""The reconcile coalescer: at most one run and one waiting per key, with a fake clock.

Hand-worked event sequences: each test drives the runs through gates it opens itself, so
which kick lands while which run is in progress is exact, and the durations are those of a
clock the test sets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from datalane_operator.coalescer import Coalescer


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Work:
    """``work(key)``: records the call, then waits for the test to open its gate; a gate
    opened with an exception makes that run fail with it."""

    calls: list[str] = field(default_factory=list)
    gates: list[asyncio.Future[None]] = field(default_factory=list)
    in_progress: dict[str, int] = field(default_factory=dict)
    most_at_once: int = 0

    async def __call__(self, key: str) -> None:
        self.calls.append(key)
        self.in_progress[key] = self.in_progress.get(key, 0) + 1
        self.most_at_once = max(self.most_at_once, self.in_progress[key])
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        try:
            await gate
        finally:
            self.in_progress[key] -= 1

    def open(self, n: int, error: Exception | None = None) -> None:
        if error is None:
            self.gates[n].set_result(None)
        else:
            self.gates[n].set_exception(error)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def drive(scenario: object) -> None:
    """Run ``scenario`` on an event loop the coalescer is given (the injected loop)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scenario(loop))  # type: ignore[operator]
    finally:
        loop.close()


def test_five_events_while_one_runs_make_exactly_two_runs() -> None:
    work, clock = Work(), Clock()
    done: list[tuple[str, float, BaseException | None]] = []

    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        c = Coalescer(work, clock=clock, loop=loop,
                      on_done=lambda k, s, e: done.append((k, s, e)))
        clock.now = 100.0
        c.kick("a")                       # run 1 starts at t=100
        await settle()
        assert work.calls == ["a"] and c.waiting == set()
        for _ in range(5):                # 5 events while run 1 is in progress
            c.kick("a")
        await settle()
        assert work.calls == ["a"] and c.waiting == {"a"}  # one waits, nothing more runs
        clock.now = 101.5
        work.open(0)                      # run 1 ends at 101.5; run 2 starts at once
        await settle()
        assert work.calls == ["a", "a"] and c.waiting == set()
        clock.now = 104.0
        work.open(1)                      # run 2 ends at 104.0; nothing is waiting
        await settle()
        assert work.calls == ["a", "a"] and c.running == {} and c.started == 2
        assert done == [("a", 1.5, None), ("a", 2.5, None)]
        assert work.most_at_once == 1

    drive(scenario)


def test_kicks_before_the_run_starts_are_one_run_and_keys_run_side_by_side() -> None:
    work = Work()

    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        c = Coalescer(work, clock=Clock(), loop=loop)
        for _ in range(100):
            c.kick("a")
        c.kick("b")
        await settle()
        assert sorted(work.calls) == ["a", "b"]  # both in progress at once, one run each
        assert set(c.running) == {"a", "b"} and c.waiting == set()
        work.open(0)
        work.open(1)
        await settle()
        assert sorted(work.calls) == ["a", "b"] and c.running == {}

    drive(scenario)


def test_a_kick_after_a_run_ended_starts_a_new_run() -> None:
    work = Work()

    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        c = Coalescer(work, clock=Clock(), loop=loop)
        c.kick("a")
        await settle()
        work.open(0)
        await settle()
        assert c.running == {}
        c.kick("a")
        await settle()
        assert work.calls == ["a", "a"] and set(c.running) == {"a"}
        work.open(1)
        await settle()

    drive(scenario)


def test_a_failed_run_is_reported_and_does_not_stop_the_waiting_one() -> None:
    work, clock = Work(), Clock()
    done: list[tuple[str, float, str | None]] = []

    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        c = Coalescer(work, clock=clock, loop=loop,
                      on_done=lambda k, s, e: done.append((k, s, e and str(e))))
        c.kick("a")
        await settle()
        c.kick("a")
        clock.now = 3.0
        work.open(0, RuntimeError("API server unavailable"))
        await settle()
        assert work.calls == ["a", "a"]
        clock.now = 3.25
        work.open(1)
        await settle()
        assert done == [("a", 3.0, "API server unavailable"), ("a", 0.25, None)]
        assert c.running == {}

    drive(scenario)


def test_cancel_all_stops_the_runs_and_drops_the_waiting_ones() -> None:
    work = Work()
    done: list[str] = []

    async def scenario(loop: asyncio.AbstractEventLoop) -> None:
        c = Coalescer(work, clock=Clock(), loop=loop, on_done=lambda k, s, e: done.append(k))
        c.kick("a")
        c.kick("b")
        await settle()
        c.kick("a")  # waiting behind the run in progress
        running = dict(c.running)
        c.cancel_all()
        await settle()
        assert all(t.cancelled() for t in running.values())
        assert c.running == {} and c.waiting == set() and done == []
        assert sorted(work.calls) == ["a", "b"]  # the waiting run never started

    drive(scenario)


def test_without_an_injected_loop_the_running_one_is_used() -> None:
    work = Work()

    async def scenario() -> None:
        c = Coalescer(work, clock=Clock())
        c.kick("a")
        await settle()
        assert work.calls == ["a"]
        work.open(0)
        await settle()

    asyncio.run(scenario())
    with pytest.raises(RuntimeError, match="no running event loop"):
        Coalescer(work, clock=Clock()).kick("a")

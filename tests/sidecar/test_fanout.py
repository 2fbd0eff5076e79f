"""One session's microbatches sent to a fast and a slow reader (:mod:`datalane_sidecar.fanout`),
without a sidecar: the items are numbers, the readers are calls (or two threads).

Both readers must get every item once, in order, the same objects; the producer may be at most
``prefetch`` items ahead of the slow reader; an item is dropped only once both readers were sent
past it and each acknowledged it or is more than ``hold`` items beyond it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from datalane_sidecar.fanout import Fanout

FAST, SLOW = 0, 1


def held() -> threading.Condition:
    """The session's condition, held by the calling test for its whole run (every Fanout
    method expects it held; these tests have one thread)."""
    cond = threading.Condition()
    cond.acquire()
    return cond


def test_a_fast_and_a_slow_reader_each_get_every_item_once_in_order() -> None:
    f: Fanout[int] = Fanout(readers=2, prefetch=3, hold=2, cond=held())
    gen = [f.attach(FAST, 0), f.attach(SLOW, 0)]
    assert gen == [1, 1]
    got: list[list[int]] = [[], []]
    made = 0

    def produce() -> None:
        nonlocal made
        while made < 10 and f.room():
            f.put(made)
            made += 1

    def take_all(reader: int) -> None:
        while (item := f.take(reader, gen[reader])) is not None:
            got[reader].append(item)
            f.ack(reader, gen[reader], len(got[reader]))

    produce()
    assert made == 3  # prefetch: 3 ahead of the slow reader at 0
    take_all(FAST)
    produce()
    assert (got[FAST], made) == ([0, 1, 2], 3)  # still bound by the slow reader
    # the slow reader takes one item per round; the fast one takes all there is
    rounds = []
    while len(got[SLOW]) < 10:
        item = f.take(SLOW, gen[SLOW])
        assert item is not None
        got[SLOW].append(item)
        f.ack(SLOW, gen[SLOW], len(got[SLOW]))
        produce()
        take_all(FAST)
        rounds.append((made, f.base))
    assert got == [list(range(10)), list(range(10))]
    # after the slow reader took item k the producer is at k + 1 + 3 (capped at 10), and both
    # readers acknowledged everything the slow one took, so nothing before it is held
    assert rounds == [(4, 1), (5, 2), (6, 3), (7, 4), (8, 5), (9, 6), (10, 7), (10, 8),
                      (10, 9), (10, 10)]


def test_an_unacknowledged_item_stays_for_a_reader_within_hold() -> None:
    f: Fanout[str] = Fanout(readers=2, prefetch=8, hold=2, cond=held())
    gen = [f.attach(FAST, 0), f.attach(SLOW, 0)]
    for item in "abcdef":
        f.put(item)
    assert [f.take(FAST, gen[FAST]) for _ in range(6)] == list("abcdef")
    assert [f.take(SLOW, gen[SLOW]) for _ in range(4)] == list("abcd")
    # nobody acknowledged: the slow reader holds 4 - 2 = 2 items back, the fast one 6 - 2 = 4
    assert f.base == 2
    # the slow reader's stream broke after 'c' reached its trainer: it attaches again at 3
    g = f.attach(SLOW, 3)
    assert g == 2 and f.take(SLOW, gen[SLOW]) is None  # the old stream takes nothing more
    assert [f.take(SLOW, g) for _ in range(3)] == ["d", "e", "f"]
    assert f.attach(SLOW, 1) is None  # dropped already


def test_two_reader_threads_at_different_speeds_read_the_same_stream() -> None:
    cond = threading.Condition()
    f: Fanout[int] = Fanout(readers=2, prefetch=4, hold=0, cond=cond)
    with cond:
        gen = [f.attach(FAST, 0), f.attach(SLOW, 0)]
    total = 40
    got: list[list[int]] = [[], []]
    ahead: list[int] = []

    def producer() -> None:
        for n in range(total):
            with cond:
                while not f.room():
                    cond.wait(0.5)
                ahead.append(f.produced - f.slowest())
                f.put(n)

    def reader(k: int, pause: float) -> None:
        while len(got[k]) < total:
            with cond:
                while (item := f.take(k, gen[k])) is None:
                    cond.wait(0.5)
                got[k].append(item)
                f.ack(k, gen[k], len(got[k]))
            time.sleep(pause)

    threads = [threading.Thread(target=producer, daemon=True),
               threading.Thread(target=reader, args=(FAST, 0), daemon=True),
               threading.Thread(target=reader, args=(SLOW, 0.002), daemon=True)]
    for t in threads:
        t.start()
    end = time.monotonic() + 10  # about 0.1 s when it works; a lost wake-up hangs
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads)
    assert got == [list(range(total)), list(range(total))]
    assert max(ahead) < 4  # never put while 4 ahead of the slowest


def test_the_producers_error_is_raised_after_the_items_made_before_it() -> None:
    """A reader is sent every item made before the failure, then gets the error (each time it
    asks); a reader still behind is not told early."""
    f: Fanout[str] = Fanout(readers=2, prefetch=8, hold=0, cond=held())
    gen = [f.attach(FAST, 0), f.attach(SLOW, 0)]
    f.put("a")
    f.put("b")
    f.fail(OSError("disk gone"))
    assert f.take(FAST, gen[FAST]) == "a" and f.take(FAST, gen[FAST]) == "b"
    for _ in range(2):
        with pytest.raises(OSError, match="disk gone"):
            f.take(FAST, gen[FAST])
    assert f.take(SLOW, gen[SLOW]) == "a"


def test_ready_counts_the_items_not_yet_sent_to_a_reader() -> None:
    """3 made, the fast reader sent 2: 1 ready for it, 3 for the slow one; none for a closed
    reader."""
    f: Fanout[int] = Fanout(readers=2, prefetch=8, hold=0, cond=held())
    gen = [f.attach(FAST, 0), f.attach(SLOW, 0)]
    for n in range(3):
        f.put(n)
    f.take(FAST, gen[FAST])
    f.take(FAST, gen[FAST])
    assert (f.ready(FAST), f.ready(SLOW)) == (1, 3)
    f.detach(SLOW, gen[SLOW])
    assert f.ready(SLOW) == 0


def test_a_closed_reader_holds_nothing_back_and_is_no_longer_attached() -> None:
    """The slow reader at 0 keeps every item and bounds the producer; once its stream closes,
    the items the fast reader acknowledged are dropped, the producer is bound by the fast one
    alone, and a detach of an older generation changes nothing."""
    f: Fanout[int] = Fanout(readers=2, prefetch=2, hold=0, cond=held())
    assert f.attached() == []  # declared, never attached
    gen = [f.attach(FAST, 0), f.attach(SLOW, 0)]
    assert f.attached() == [FAST, SLOW]
    f.put(0)
    f.put(1)
    assert not f.room() and f.slowest() == 0
    assert [f.take(FAST, gen[FAST]), f.take(FAST, gen[FAST])] == [0, 1]
    f.ack(FAST, gen[FAST], 2)
    assert f.base == 0  # the slow reader has not been sent 0 yet
    f.detach(SLOW, gen[SLOW] - 1)  # a stream of an older attachment: not this one
    assert f.attached() == [FAST, SLOW] and f.base == 0
    f.detach(SLOW, gen[SLOW])
    assert f.attached() == [FAST] and f.base == 2 and f.slowest() == 2 and f.room()
    assert f.take(SLOW, gen[SLOW]) is None
    f.detach(FAST, gen[FAST])
    assert f.slowest() == f.produced == 2  # nobody counted: the producer is not held back


def test_an_ack_of_an_older_generation_or_an_earlier_count_changes_nothing() -> None:
    """With hold 8 an item sent stays until its reader acknowledges it in its current
    attachment, and a smaller count does not take an acknowledgement back."""
    f: Fanout[int] = Fanout(readers=1, prefetch=8, hold=8, cond=held())
    g = f.attach(FAST, 0)
    for n in range(4):
        f.put(n)
    for _ in range(4):
        f.take(FAST, g)
    f.ack(FAST, g - 1, 3)  # a stream of an older attachment
    assert f.base == 0
    f.ack(FAST, g, 3)
    assert f.base == 3
    f.ack(FAST, g, 1)
    assert f.slots[FAST].acked == 3 and f.base == 3


def _wakes(cond: threading.Condition, act: Callable[[], object]) -> bool:
    """Whether a thread waiting on ``cond`` is notified (not timed out) by ``act``."""
    waiting, result = threading.Event(), []

    def waiter() -> None:
        with cond:
            waiting.set()
            result.append(cond.wait(10))

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    waiting.wait(10)
    with cond:  # the waiter is in wait() once it released the lock
        act()
    t.join(15)
    return result == [True]


@pytest.mark.parametrize("act", ["put", "take", "attach", "detach", "fail"])
def test_every_change_a_waiter_may_wait_for_notifies_it(act: str) -> None:
    """The producer waits for room, the readers for items, errors or a re-attachment: each
    change wakes the threads waiting on the session's condition at once."""
    cond = threading.Condition()
    f: Fanout[int] = Fanout(readers=1, prefetch=4, hold=0, cond=cond)
    with cond:
        g = f.attach(FAST, 0)
        f.put(0)
    acts: dict[str, Callable[[], object]] = {
        "put": lambda: f.put(1), "take": lambda: f.take(FAST, g),
        "attach": lambda: f.attach(FAST, 0), "detach": lambda: f.detach(FAST, g),
        "fail": lambda: f.fail(OSError())}
    assert _wakes(cond, acts[act])

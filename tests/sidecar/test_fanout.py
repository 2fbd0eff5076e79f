"""One session's microbatches sent to a fast and a slow reader (:mod:`datalane_sidecar.fanout`),
without a sidecar: the items are numbers, the readers are calls (or two threads).

Both readers must get every item once, in order, the same objects; the producer may be at most
``prefetch`` items ahead of the slow reader; an item is dropped only once both readers were sent
past it and each acknowledged it or is more than ``hold`` items beyond it.
"""

from __future__ import annotations

import threading
import time

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

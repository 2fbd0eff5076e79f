"""A test's own time limit: :func:`deadline` interrupts the main thread's Python-level work.

Hostile-input tests use it so that, on code without the bound they check, they fail in
seconds instead of running for minutes (a 10^10-iteration template loop, a YAML bomb being
expanded). It relies on SIGALRM, so it works in pytest's main thread only; a single C call
(a 10 GB allocation) is not interrupted.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TookTooLong", "deadline"]


class TookTooLong(Exception):
    """Raised in the test when its :func:`deadline` passes."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`TookTooLong` in the block's code once ``seconds`` have passed."""
    def expire(signum: int, frame: object) -> None:
        raise TookTooLong(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

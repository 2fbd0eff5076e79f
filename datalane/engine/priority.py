"""Bulk threads run below the threads that hand data to the trainer.

The map workers (decode, tokenize, render) and the block readers (storage reads,
decompression) are throughput work: a millisecond later is never noticed, because they run
whole map tasks and blocks ahead of the consumer. The threads that hand a finished microbatch
over are latency work: a sidecar's gRPC and session threads, a trainer's own loop beside an
in-process loader. On a busy machine a waking latency thread waits for a CPU behind the bulk
ones (measured in the feed test on 2 cores: microbatches placed seconds before the trainer
asked for them, delivered 2-8 ms late on 2.8-3.9% of its steps, 2.4-2.6% with the bulk threads
niced; docs/benchmarks.md).

So each bulk thread lowers its own scheduling priority once, at start: its nice value goes up
by :data:`BULK_NICE` (Linux keeps a nice value per thread; threads a bulk thread starts - the
tokenizer's own Rust pool, started by the first tokenizer call on a map worker - inherit it).
Nothing waits on the order the threads run in (results are consumed in submission order), so
priority changes timing only, never data. An idle machine runs them as fast as before; the
niced threads yield to others only where they compete for a CPU. Raising a nice value needs no
privilege; where the platform has no per-thread nice the thread keeps its priority.
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["BULK_NICE", "lower_this_thread"]

BULK_NICE = 5  # added to a bulk thread's nice value (weight about a third of nice 0's)
_MAX_NICE = 19


def lower_this_thread(by: int = BULK_NICE) -> int | None:
    """Raise the calling thread's nice value by ``by`` (at most to 19); the new value, or None
    where it could not be changed (not Linux, or refused)."""
    if not sys.platform.startswith("linux") or by <= 0:
        return None
    tid = threading.get_native_id()
    try:
        nice = min(_MAX_NICE, os.getpriority(os.PRIO_PROCESS, tid) + by)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:  # a seccomp profile may refuse it: the thread runs as before
        return None
    return nice

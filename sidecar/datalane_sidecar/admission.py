"""How many calls the sidecar serves at once, and the server threads that takes.

The sidecar's gRPC server runs every call on a thread of one pool. A Stream holds its thread
for the stream's life, a Checkpoint holds one until every rank of the pod has asked, an Open
holds one while it replays a session; with a fixed pool of 64 threads, 48 ranks checkpointing
took every thread, the other ranks' Checkpoints and the kubelet's Health probes queued behind
them and nothing moved again (issue 23). So the calls that can last are counted here, each
kind against a limit, and the pool is sized from the limits plus a reserve that only the short
calls (Health, Stats, Close) can use:

* ``max_streams`` Streams: a pod's trainer processes (data-parallel ranks x readers: TP/CP
  peers) each read one, and one more per eval stream they evaluate at the same time.
* ``max_streams`` Checkpoints and ``max_streams`` Opens in flight (a client has one of each
  at a time at the most).
* :data:`RESERVE` threads beyond those, so Health never waits for a thread.

A call past its limit is refused at once with ``RESOURCE_EXHAUSTED``, naming the limit and the
flag that raises it; it never waits for a thread. Threads are started only when calls need
them (an idle sidecar has none of these). Used by :mod:`datalane_sidecar.service` (the counts)
and :mod:`datalane_sidecar.server` (the pool's size). When rank sessions move to worker
processes (issue 19), the server process keeps this admission: it still holds one thread per
routed stream and per waiting checkpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

__all__ = ["RESERVE", "Admission", "default_max_streams"]

RESERVE = 32  # threads only the short calls (Health, Stats, Close) are left to use
_AUTO_FLOOR = 256
_READERS_PER_RANK = 8  # TP x CP peers of a data-parallel rank in one pod: a node's GPUs


def default_max_streams(ranks_per_pod: int, eval_streams: int) -> int:
    """Streams a pod of ``ranks_per_pod`` data-parallel ranks can open: each rank's readers
    (up to 8, a node's GPUs) on the training stream and on every eval stream at once; at
    least 256."""
    return max(_AUTO_FLOOR, ranks_per_pod * _READERS_PER_RANK * (1 + eval_streams))


class Admission:
    """Counts the calls that hold a server thread for long, each kind against its limit."""

    KINDS = ("stream", "checkpoint", "open")

    def __init__(self, max_streams: int, flag: str = "--max-streams") -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, not {max_streams}")
        self.max_streams = max_streams
        self.flag = flag
        self.active = dict.fromkeys(self.KINDS, 0)
        self.refused = dict.fromkeys(self.KINDS, 0)
        self._lock = threading.Lock()

    def pool_size(self) -> int:
        """Server threads: one per admitted call of every kind, plus the reserve."""
        return len(self.KINDS) * self.max_streams + RESERVE

    @contextmanager
    def hold(self, kind: str, context: grpc.ServicerContext) -> Iterator[None]:
        """Count one ``kind`` call for the block; refuse it with RESOURCE_EXHAUSTED if
        ``max_streams`` of them are in flight."""
        with self._lock:
            admitted = self.active[kind] < self.max_streams
            if admitted:
                self.active[kind] += 1
            else:
                self.refused[kind] += 1
                count = self.active[kind]
        if not admitted:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"this sidecar serves at most {self.max_streams} {kind} calls at "
                          f"once and {count} are in flight (the limit {self.flag}="
                          f"{self.max_streams}, env DATALANE_MAX_STREAMS: raise it for a pod "
                          f"with more trainer processes x eval streams)")
        try:
            yield
        finally:
            with self._lock:
                self.active[kind] -= 1

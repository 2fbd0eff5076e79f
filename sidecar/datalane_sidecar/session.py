"""A session: the lanes of one rank, produced ahead of the trainer into a bounded queue.

A producer thread drives a :class:`datalane.Loader` step by step. Before each step it records
the rank's checkpoint at that step boundary (a few hundred bytes per lane), so the sidecar can
persist any boundary the trainer asks for and can put the boundary state in the step's first
microbatch; after each step it records the lanes' window digests (the ledger). Microbatches
wait in a queue of ``prefetch`` entries: the producer blocks when the trainer falls behind.

A session that starts after the store's last committed step (a sidecar restarted, or a trainer
resumed from its own saved position) does not have the digests of the steps in between, which
the next checkpoint's ledger must list. :meth:`Session.backfill` recomputes them on the side:
a second loader restored from the committed checkpoint runs to the session's first step, and
its digests are used only if it lands exactly on the session's start state.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import microbatches_per_step
from datalane.spec.state import Checkpoint

__all__ = ["Prepared", "Session"]

log = logging.getLogger("datalane.sidecar")

# Boundaries (a few hundred bytes per lane) are kept from the last checkpoint on, up to this
# many: far more than the producer can run ahead of the trainer (ring + queue + transport).
_KEEP_BOUNDARIES = 4096
_KEEP_DIGEST_STEPS = 100_000


@dataclass
class Prepared:
    """One microbatch ready to send."""

    step: int
    index: int
    input_ids: np.ndarray
    positions: np.ndarray
    ended: bool
    state_json: str  # last index only: the checkpoint at the boundary after this step
    lane_digests: dict[int, bytes]  # last index only


class Session:
    """Serves rank ``rank`` of ``world_size`` from a resume point."""

    def __init__(self, session_id: str, plan: Plan, pool: TaskPool, knobs: Knobs, rank: int,
                 world_size: int, microbatch_size: int, start: Checkpoint | None,
                 skip_microbatches: int, prefetch: int) -> None:
        per_step = microbatches_per_step(plan.recipe.global_batch_size, world_size,
                                         microbatch_size)
        self.id = session_id
        self._plan, self._knobs = plan, knobs
        self._start = start
        self.backfilled = threading.Event()  # set when no backfill runs or it has ended
        self.backfilled.set()
        self.rank = rank
        self.world_size = world_size
        self.microbatch_size = microbatch_size
        self.per_step = per_step
        if skip_microbatches >= self.per_step:
            raise ConfigError(f"skip_microbatches {skip_microbatches} must be below the "
                              f"{self.per_step} microbatches of a step")
        self.loader = Loader(plan.recipe, rank, world_size, knobs, plan=plan, pool=pool)
        if start is not None:
            self.loader.load_state_dict(start)
        self.first_step = self.loader.step
        self._skip = skip_microbatches
        self._queue: queue.Queue[Prepared | BaseException] = queue.Queue(maxsize=prefetch)
        self._lock = threading.Condition()
        self._boundaries: OrderedDict[int, str] = OrderedDict()
        self.digests: OrderedDict[int, dict[int, bytes]] = OrderedDict()
        self._stop = threading.Event()
        self.waited_seconds = 0.0
        self.sent: tuple[int, int] | None = None  # (step, index) of the last microbatch sent
        self.acked: tuple[int, int] | None = None  # (step, consumed) the client reported
        self.first_skip = skip_microbatches
        self.produced_tokens = 0
        self._thread = threading.Thread(target=self._produce, name=f"session-{session_id}",
                                        daemon=True)
        self._thread.start()

    @property
    def lanes(self) -> range:
        return self.loader.lanes

    def _put(self, item: Prepared | BaseException) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _record(self, step: int) -> str:
        state = json.dumps(self.loader.state_dict(), separators=(",", ":"))
        with self._lock:
            self._boundaries[step] = state
            while len(self._boundaries) > _KEEP_BOUNDARIES:
                self._boundaries.popitem(last=False)
            self._lock.notify_all()
        return state

    def _produce(self) -> None:
        try:
            self._record(self.loader.step)
            while not self._stop.is_set():
                step = self.loader.next_step()
                s = step.step
                after = self._record(s + 1)  # the boundary the trainer reaches after step s
                with self._lock:
                    self.digests[s] = step.lane_digests
                    while len(self.digests) > _KEEP_DIGEST_STEPS:
                        self.digests.popitem(last=False)
                self.produced_tokens += int((step.positions >= 0).sum())
                m = self.microbatch_size
                last = self.per_step - 1
                for i in range(self.per_step):
                    if self._skip:
                        self._skip -= 1
                        continue
                    sl = slice(i * m, (i + 1) * m)
                    item = Prepared(s, i, step.input_ids[sl], step.positions[sl], step.ended,
                                    after if i == last else "",
                                    step.lane_digests if i == last else {})
                    if not self._put(item):
                        return
        except BaseException as e:  # surfaced to the trainer through the stream
            self._put(e)

    def next(self, timeout: float) -> Prepared | None:
        """The next microbatch, or None if none became ready within ``timeout``."""
        t0 = time.perf_counter()
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            self.waited_seconds += time.perf_counter() - t0
            return None
        self.waited_seconds += time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        return item

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def state_at(self, step: int, timeout: float = 60.0) -> str:
        """The checkpoint JSON of this rank's lanes at the boundary before ``step``."""
        with self._lock:
            ok = self._lock.wait_for(lambda: step in self._boundaries
                                     or (self._boundaries and min(self._boundaries) > step)
                                     or self._stop.is_set(), timeout)
            if step in self._boundaries:
                return self._boundaries[step]
        if not ok:
            raise ConfigError(f"step {step} was not reached within {timeout:.0f} s")
        first = min(self._boundaries) if self._boundaries else self.first_step
        raise ConfigError(f"step {step} is no longer held by the session (it keeps boundaries "
                          f"from step {first} on); checkpoint at the current step")

    def backfill(self, since: int, load: Callable[[], Checkpoint]) -> None:
        """Recompute, on a thread of its own, the digests of steps ``since`` up to the first
        step from the checkpoint ``load()`` returns (the committed step ``since``)."""
        if since >= self.first_step or self._start is None:
            return
        self.backfilled.clear()
        threading.Thread(target=self._backfill, args=(since, load), daemon=True,
                         name=f"backfill-{self.id}").start()

    def _backfill(self, since: int, load: Callable[[], Checkpoint]) -> None:
        assert self._start is not None
        # the trainer's first step comes first: the replay starts once it is produced
        deadline = time.monotonic() + 120.0
        with self._lock:
            while not (max(self._boundaries, default=-1) > self.first_step
                       or self._stop.is_set() or not self._thread.is_alive()
                       or time.monotonic() > deadline):
                self._lock.wait(0.5)
        pool = TaskPool(1, "datalane-backfill")
        loader = Loader(self._plan.recipe, self.rank, self.world_size, self._knobs,
                        plan=self._plan, pool=pool)
        try:
            loader.load_state_dict(load())
            got: dict[int, dict[int, bytes]] = {}
            for s in range(since, self.first_step):
                if self._stop.is_set():
                    return
                got[s] = loader.next_step().lane_digests
            reached = Checkpoint.from_json(loader.state_dict()).lanes
            for lane in self.lanes:
                if reached[lane] != self._start.lanes[lane]:
                    raise MismatchError(f"replaying lane {lane} from the checkpoint of step "
                                        f"{since} does not reach the state this session "
                                        f"started from at step {self.first_step}")
            with self._lock:
                for s in sorted(got, reverse=True):  # older than every digest held: first
                    self.digests[s] = got[s]
                    self.digests.move_to_end(s, last=False)
            log.info("ledger of steps %d-%d rebuilt for rank %d", since, self.first_step - 1,
                     self.rank)
        except Exception as e:  # the next manifest then shows the gap; audit reports it
            log.warning("cannot rebuild the ledger of steps %d-%d for rank %d: %s", since,
                        self.first_step - 1, self.rank, e)
        finally:
            loader.close()
            pool.shutdown(wait=False, cancel_futures=True)
            self.backfilled.set()

    def forget_before(self, step: int) -> None:
        """Drop boundaries and digests older than ``step`` (after a checkpoint of ``step``)."""
        with self._lock:
            for old in [s for s in self._boundaries if s < step]:
                del self._boundaries[old]
            for old in [s for s in self.digests if s < step]:
                del self.digests[old]

    def digests_between(self, start: int, stop: int) -> dict[int, dict[int, bytes]]:
        with self._lock:
            return {s: d for s, d in self.digests.items() if start <= s < stop}

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        self._thread.join(timeout=5)
        self.loader.close_streams()

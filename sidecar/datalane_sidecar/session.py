"""A session: the lanes of one data-parallel rank, produced once, ahead of its readers.

A producer thread drives a :class:`datalane.Loader` step by step. At each step boundary it
records the rank's lane states (a :class:`~datalane_sidecar.boundaries.Boundary`, a few hundred
bytes per lane), so the sidecar can persist any boundary the trainer asks for and can put the
boundary's checkpoint in the step's last microbatch; after each step it records the lanes'
window digests (the ledger).

The microbatches go to ``readers`` readers (ranks sharing the data-parallel rank under tensor,
context or pipeline parallelism), each with a stream of its own: a
:class:`~datalane_sidecar.fanout.Fanout` keeps each microbatch until every reader was sent past
it, and the producer waits while it is ``prefetch`` microbatches ahead of the slowest reader.
A reader attaches at its start position (:meth:`Session.attach`) if the session still holds it
with the same lane states, so a restarted reader rejoins without recomputing anything.

A session that starts after the store's last committed step (a sidecar restarted, or a trainer
resumed from its own saved position) does not have the digests of the steps in between, which
the next checkpoint's ledger must list. :meth:`Session.backfill` recomputes them on the side:
a second loader restored from the committed checkpoint runs to the session's first step, and
its digests are used only if it lands exactly on the session's start state.

A session serves one stream of the recipe: the training stream, or an eval stream (built on
the eval stream's own plan, :func:`datalane.spec.evals.eval_recipe`), which produces exactly
its ``steps`` steps and then ends (:meth:`Session.exhausted`); the sidecar never checkpoints
it and keeps no ledger for it.

Used by :class:`~datalane_sidecar.service.DataLaneService`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import ConfigError, MismatchError, StorageError
from datalane.spec.evals import TRAIN
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import rank_shape
from datalane.spec.state import Checkpoint
from datalane.wire.layout import Layout
from datalane.wire.shm import ShmWriter
from datalane_sidecar.boundaries import Boundary, CheckpointText
from datalane_sidecar.delivery import Sent, gather
from datalane_sidecar.fanout import Fanout

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
    columns: dict[str, np.ndarray]  # the schema's columns, in schema order
    ended: bool
    after: Boundary | None  # last index only: the lane states at the boundary after the step
    lane_digests: dict[int, bytes]  # last index only
    step_tokens: int = 0  # trained targets of the rank's step (every microbatch of it)

    @property
    def rows(self) -> int:
        return len(self.columns["positions"])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.columns.values())


class Session:
    """Serves rank ``rank`` of ``world_size`` from a resume point to ``readers`` readers: of
    the training stream, or of eval stream ``stream`` (``plan`` is then the eval stream's,
    and ``steps`` the steps it yields before it ends)."""

    def __init__(self, session_id: str, plan: Plan, pool: TaskPool, knobs: Knobs, rank: int,
                 world_size: int, microbatch_size: int, start: Checkpoint | None,
                 skip_microbatches: int, prefetch: int, readers: int = 1,
                 texts: CheckpointText | None = None, stream: str = TRAIN,
                 steps: int | None = None) -> None:
        # every rank yields `total` microbatches per step; a rank with fewer lanes than others
        # ends its step with fully padded ones, produced here like the real ones
        per_step = rank_shape(plan.recipe.lanes, plan.recipe.global_batch_size, world_size,
                              rank, microbatch_size).total
        if readers < 1:
            raise ConfigError(f"a session needs at least one reader, got {readers}")
        self.id = session_id
        self.stream = stream
        self.steps = steps  # None: endless (the training stream)
        self.done = False  # the producer made every step of a finite stream
        self._plan, self._knobs = plan, knobs
        self._start = start
        self.texts = texts or CheckpointText(plan)
        self.backfilled = threading.Event()  # set when no backfill runs or it has ended
        self.backfilled.set()
        self.rank = rank
        self.world_size = world_size
        self.microbatch_size = microbatch_size
        self.readers = readers
        self.per_step = per_step
        self.layout = Layout.of(plan.schema, microbatch_size, plan.recipe.sequence_tokens)
        if skip_microbatches >= self.per_step:
            raise ConfigError(f"skip_microbatches {skip_microbatches} must be below the "
                              f"{self.per_step} microbatches of a step")
        self.loader = Loader(plan.recipe, rank, world_size, knobs, plan=plan, pool=pool)
        if start is not None:
            self.loader.load_state_dict(start)
        self.first_step = self.loader.step
        if steps is not None and self.first_step >= steps:
            self.loader.close_streams()
            raise ConfigError(f"step {self.first_step} is past the {steps} steps of eval "
                              f"stream {stream!r}; an evaluation opens it from the start")
        self._skip = skip_microbatches
        self._lock = threading.Condition()
        # a client acknowledges its position at least once per step and once per quarter of
        # its ring (64 slots at most): unacknowledged microbatches are kept that far back
        # for a reader that may attach again; a single reader never does
        hold = prefetch + 2 * per_step + 64 if readers > 1 else 0
        self._fanout: Fanout[Prepared] = Fanout(readers, prefetch, hold, self._lock)
        self._boundaries: OrderedDict[int, Boundary] = OrderedDict()
        self.digests: OrderedDict[int, dict[int, bytes]] = OrderedDict()
        self._stop = threading.Event()
        self.waited_seconds = 0.0
        self.first_skip = skip_microbatches
        self.produced_tokens = 0
        self._record(self.first_step)  # before the thread: a reader may attach here at once
        self._thread = threading.Thread(target=self._produce, name=f"session-{session_id}",
                                        daemon=True)
        self._thread.start()

    @property
    def lanes(self) -> range:
        return self.loader.lanes

    @property
    def plan(self) -> Plan:
        """The plan of the stream this session serves."""
        return self._plan

    @property
    def is_eval(self) -> bool:
        return self.stream != TRAIN

    @property
    def lost(self) -> str | None:
        """Why the process that holds the session is gone; never, for a session here (a
        :class:`~datalane_sidecar.remote.RemoteSession`'s worker may die)."""
        return None

    def new_ring(self, hid: str, path: str, slots: int, mode: int) -> ShmWriter:
        """The shared-memory ring of handle ``hid``, written where the session lives."""
        return ShmWriter(path, slots, self.layout, mode)

    def gather(self, reader: int, generation: int, ring: ShmWriter | None,
               timeout: float) -> list[Sent]:
        """The reader's next Stream message's microbatches (:func:`delivery.gather`)."""
        return gather(self, reader, generation, ring, timeout)

    def describe(self) -> dict[str, Any]:
        """The session as the Stats call shows it."""
        return {"stream": self.stream, "rank": self.rank, "world_size": self.world_size,
                "lanes": [self.lanes.start, self.lanes.stop],
                "next_step": self.loader.step, "first_step": self.first_step,
                "queue_depth": self.queue_depth(),
                "acked": list(self.acked) if self.acked else None,
                "readers": self.readers, "attached": self.attached(),
                "reader_positions": self.reader_positions(),
                "kept_boundaries": self.kept_boundaries(),
                "waited_seconds": round(self.waited_seconds, 4),
                "counters": self.loader.counters().encode()}

    def gauges(self) -> dict[str, Any]:
        """What the metrics read of the session on a scrape."""
        return {"waited_seconds": self.waited_seconds, "step": self.loader.step,
                "skipped": dict(self.loader.counters().skipped),
                "mixture_tokens": list(self.loader.mixture_tokens())}

    def exhausted(self, reader: int) -> bool:
        """Whether a finite stream was made to its end and ``reader`` was sent all of it."""
        with self._lock:
            return self.done and self._fanout.error is None and self._fanout.ready(reader) == 0

    def _put(self, item: Prepared) -> bool:
        with self._lock:
            while not self._fanout.room():
                if self._stop.is_set():
                    return False
                self._lock.wait(0.1)
            if self._stop.is_set():
                return False
            self._fanout.put(item)
        return True

    def _record(self, step: int) -> Boundary:
        boundary = Boundary.of(self.loader.state_dict())
        with self._lock:
            self._boundaries[step] = boundary
            while len(self._boundaries) > _KEEP_BOUNDARIES:
                self._boundaries.popitem(last=False)
            self._lock.notify_all()
        return boundary

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():
                if self.steps is not None and self.loader.step >= self.steps:
                    with self._lock:
                        self.done = True  # the readers' streams end once they sent it all
                        self._lock.notify_all()
                    return
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
                    item = Prepared(s, i, step.microbatch(i, m).columns, step.ended,
                                    after if i == last else None,
                                    step.lane_digests if i == last else {}, step.step_tokens)
                    if not self._put(item):
                        return
        except BaseException as e:  # surfaced to the trainers through their streams
            with self._lock:
                self._fanout.fail(e)

    # -- readers -----------------------------------------------------------------------------
    def attach(self, reader: int, step: int, lanes: dict[int, str], skip: int,
               wait: float = 0.0) -> int | None:
        """Attach ``reader`` at microbatch ``skip`` of ``step`` if the session still holds that
        position and its boundary has exactly the lane states ``lanes`` (lane -> compact JSON);
        returns the attachment's generation, or None if the session cannot serve it. A
        boundary the producer is computing now (the next one, with room to go on) is waited
        for up to ``wait`` seconds: a trainer that drains what a previous sidecar sent checkpoints
        one step ahead of a session opened at its previous checkpoint."""
        if not 0 <= reader < self.readers or not 0 <= skip < self.per_step:
            return None

        def settled() -> bool:
            if step in self._boundaries or self._stop.is_set() or not self._thread.is_alive():
                return True
            return not (step == max(self._boundaries, default=-2) + 1 and self._fanout.room())

        with self._lock:
            if wait > 0:
                self._lock.wait_for(settled, wait)
            held = self._boundaries.get(step)
            if held is None or dict(held.lanes) != lanes:
                return None
            at = (step - self.first_step) * self.per_step + skip - self.first_skip
            generation = self._fanout.attach(reader, at) if at >= 0 else None
            if generation is not None:  # where its trainer stands (a drain's resume point)
                self._fanout.slots[reader].position = (step, skip)
            return generation

    def claim(self, reader: int) -> int:
        """Attach ``reader`` at the session's start (the reader that opened it)."""
        with self._lock:
            generation = self._fanout.attach(reader, 0)
        assert generation is not None  # nothing is dropped before every reader attached
        return generation

    def detach(self, reader: int, generation: int) -> None:
        with self._lock:
            self._fanout.detach(reader, generation)

    def attached(self) -> list[int]:
        with self._lock:
            return self._fanout.attached()

    def next(self, reader: int, generation: int, timeout: float) -> Prepared | None:
        """The reader's next microbatch, or None if none became ready within ``timeout`` (or
        the reader was attached again since ``generation``)."""
        fan = self._fanout
        slot = fan.slots[reader]

        def wake() -> bool:
            return (fan.ready(reader) > 0 or fan.error is not None or self._stop.is_set()
                    or slot.generation != generation or self.done)

        t0 = time.perf_counter()
        try:
            with self._lock:
                if timeout > 0:
                    self._lock.wait_for(wake, timeout)
                return fan.take(reader, generation)
        finally:
            self.waited_seconds += time.perf_counter() - t0

    def sent_to(self, reader: int, generation: int, position: tuple[int, int]) -> None:
        """Record the (step, index) last sent to the reader."""
        with self._lock:
            if self._fanout.slots[reader].generation == generation:
                self._fanout.slots[reader].sent = position

    def acked_by(self, reader: int, generation: int, position: tuple[int, int]) -> None:
        """Record the (step, consumed) the reader's client reported."""
        step, consumed = position
        done = (step - self.first_step) * self.per_step + consumed - self.first_skip
        with self._lock:
            if self._fanout.slots[reader].generation == generation:
                self._fanout.slots[reader].position = position
                self._fanout.ack(reader, generation, done)

    @property
    def sent(self) -> tuple[int, int] | None:
        """The slowest reader's last microbatch sent."""
        with self._lock:
            return min((s.sent for s in self._fanout.slots if s.sent), default=None)

    @property
    def acked(self) -> tuple[int, int] | None:
        """The slowest reader's acknowledged position (every reader can resume from it)."""
        with self._lock:
            return min((s.position for s in self._fanout.slots if s.position), default=None)

    def reader_positions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"attached": bool(s.generation and s.cursor is not None),
                     "sent": list(s.sent) if s.sent else None,
                     "acked": list(s.position) if s.position else None,
                     "ready": self._fanout.ready(k)}
                    for k, s in enumerate(self._fanout.slots)]

    def queue_depth(self, reader: int | None = None) -> int:
        """Microbatches ready for ``reader`` (default: ahead of the slowest reader)."""
        with self._lock:
            if reader is None:
                return self._fanout.produced - self._fanout.slowest()
            return self._fanout.ready(reader)

    # -- boundaries --------------------------------------------------------------------------
    def kept_boundaries(self) -> dict[str, int]:
        """How many step boundaries the session keeps, and their bytes."""
        with self._lock:
            return {"count": len(self._boundaries),
                    "bytes": sum(b.nbytes() for b in self._boundaries.values())}

    def state_at(self, step: int, timeout: float = 60.0) -> str:
        """The checkpoint JSON of this rank's lanes at the boundary before ``step``."""
        with self._lock:
            ok = self._lock.wait_for(lambda: step in self._boundaries
                                     or (self._boundaries and min(self._boundaries) > step)
                                     or self._stop.is_set(), timeout)
            boundary = self._boundaries.get(step)
        if boundary is not None:
            return self.texts.text(boundary)
        if not ok:
            raise ConfigError(f"step {step} was not reached within {timeout:.0f} s")
        if self._stop.is_set():  # replaced or closed while the request waited: ask again
            raise StorageError(f"the session of rank {self.rank} closed before step {step} "
                               f"was reached; open one at your position and ask again",
                               transient=True)
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
        pool: TaskPool | None = None
        loader: Loader | None = None
        try:  # (a pool or loader that cannot be made is a failed rebuild: backfilled is set)
            pool = TaskPool(1, "datalane-backfill")
            loader = Loader(self._plan.recipe, self.rank, self.world_size, self._knobs,
                            plan=self._plan, pool=pool)
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
            if loader is not None:
                loader.close()
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            self.backfilled.set()

    def forget_before(self, step: int) -> None:
        """Drop boundaries and digests older than ``step`` (after a checkpoint of ``step``);
        the boundaries of microbatches still held for a slower reader stay (it may attach
        there again)."""
        with self._lock:
            held = self.first_step + (self._fanout.base + self.first_skip) // self.per_step
            for old in [s for s in self._boundaries if s < min(step, held)]:
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

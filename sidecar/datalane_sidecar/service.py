"""The gRPC servicer: sessions per rank, microbatch streams, checkpoints, health and stats.

Thin over :class:`~datalane_sidecar.session.Session` and
:class:`~datalane_sidecar.checkpoints.PodCheckpoints`; errors become gRPC status codes with
the library's message (INVALID_ARGUMENT for bad requests, FAILED_PRECONDITION for protocol or
fingerprint mismatches, NOT_FOUND for a missing checkpoint).

The reply to Open announces the recipe's sample schema and the byte layout of one microbatch
(:class:`datalane.wire.layout.Layout`); microbatches carry the columns by it, inline or in
the session's shared-memory ring. An Open of another wire protocol version is refused before
anything else, naming both versions and the side to upgrade.

A data-parallel rank has one session. An Open attaches as reader ``reader`` (of ``readers``:
ranks that share the data-parallel rank) to the rank's live session when that session serves
the same world size, microbatch size and readers and still holds the requested position with
the same lane states; each reader gets a handle (the ``session_id`` it streams with) and a
shared-memory ring of its own. A single reader attaches too: a trainer that checkpoints while
it drains what a previous sidecar sent re-opens one step further each time, and follows the
session it opened instead of replaying a new one per step. Any other Open builds a new session
and only then replaces the rank's live one, so a refused request never disturbs a healthy
trainer. Started by :func:`datalane_sidecar.server.serve`.

Eval streams: an Open naming an eval stream of the recipe (``stream``; "" is the training
stream) builds a session on that stream's plan (planned once, when the service starts, so a
bad eval source stops the sidecar at start and not at the first evaluation). It shares the
worker pool, starts at step 0, yields the stream's steps and then ends its Stream with OK; it
is never checkpointed, writes no resume point and no ledger, and is replaced only by another
Open of the same stream and rank: the rank's training session is never disturbed by it.

Rank worker processes (``rank_processes`` > 0, ``--rank-processes``): the sessions live in
worker processes (:mod:`datalane_sidecar.remote`), each standing here as a
:class:`~datalane_sidecar.remote.RemoteSession` with the same interface, and each reader's ring
is written by the worker; what a Stream message holds is made by
:func:`datalane_sidecar.delivery.gather` wherever the session lives. A worker that dies closes
its sessions as a restart would (their streams end UNAVAILABLE). Which steps' digests a
checkpoint lists is decided by :mod:`datalane_sidecar.ledger`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import ConfigError, DatalaneError, MismatchError, StorageError
from datalane.spec.evals import TRAIN, check_stream, eval_recipe, eval_steps
from datalane.spec.fingerprint import check_fingerprint
from datalane.spec.integrity import parse_json
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import check_world_size
from datalane.spec.state import Checkpoint, LaneState
from datalane.store.calls import StoreCalls
from datalane.wire import (
    CLIENT_KEY,
    NO_SESSION_KEY,
    PROTOCOL_VERSION,
    STORE_ERROR_KEY,
    protocol_mismatch,
)
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from datalane.wire.layout import announce_schema
from datalane.wire.shm import ShmWriter
from datalane_sidecar.admission import Admission, default_max_streams
from datalane_sidecar.boundaries import CheckpointText, lane_json
from datalane_sidecar.checkpoints import STORE_SECONDS, PodCheckpoints
from datalane_sidecar.delivery import RingClosed
from datalane_sidecar.ledger import backfill_from, ledger_since, ledger_steps, next_since
from datalane_sidecar.metrics import Metrics
from datalane_sidecar.remote import (
    RankProcesses,
    RankWorker,
    RemoteRing,
    RemoteSession,
    WorkerLost,
)
from datalane_sidecar.session import Session
from datalane_sidecar.timing import Laps

__all__ = ["DataLaneService"]

log = logging.getLogger("datalane.sidecar")
_SHM_SLOTS = 8  # at least this many slots per session's ring ...
_SHM_RING_BYTES = 4 << 20  # ... and more for small microbatches, up to this size (and 64)
_SHM_MAX_SLOTS = 64


_ATTACH_WAIT_SECONDS = 10.0  # for the boundary a live session's producer is computing
_BACKFILL_WAIT_SECONDS = 600.0  # a checkpoint waits this long for a ledger being rebuilt


def _ring_slots(slot_bytes: int) -> int:
    """Slots of a session's ring: small microbatches get more, so the client can release
    them in batches (one Ack per quarter of the ring) with the sidecar still well ahead."""
    return max(_SHM_SLOTS, min(_SHM_MAX_SLOTS, _SHM_RING_BYTES // max(1, slot_bytes)))


def _abort(context: grpc.ServicerContext, error: BaseException, prefix: str = "") -> None:
    code = grpc.StatusCode.INTERNAL
    if isinstance(error, MismatchError):
        code = grpc.StatusCode.FAILED_PRECONDITION
    elif isinstance(error, ConfigError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(error, StorageError):
        code = grpc.StatusCode.UNAVAILABLE if error.transient else grpc.StatusCode.NOT_FOUND
    elif isinstance(error, DatalaneError):
        code = grpc.StatusCode.FAILED_PRECONDITION
    context.abort(code, prefix + str(error))


@dataclass(frozen=True)
class _Handle:
    """One reader's attachment to a session: what the session_id of an OpenReply names.
    The reader that opened the session has the session's own id."""

    session: Session | RemoteSession
    reader: int
    generation: int


class DataLaneService(pbg.DataLaneServicer):
    def __init__(self, plan: Plan, knobs: Knobs, prefetch: int, store: Any | None, pod: str,
                 ranks_per_pod: int, shm_dir: str, metrics: Metrics,
                 shm_mode: int = 0o600, started: Laps | None = None,
                 max_streams: int | None = None, rank_processes: int = 0) -> None:
        self.plan = plan
        self.knobs = knobs
        self.prefetch = prefetch
        self.store = store
        self.shm_dir = shm_dir
        self.shm_mode = shm_mode  # the socket's: whoever may connect may map the rings
        self.metrics = metrics
        self.pool = TaskPool.of(knobs)
        # the store's reads on threads of their own, each bounded: a store that hangs holds
        # those threads, never one that serves batches (datalane.store.calls)
        self.store_calls = StoreCalls(getattr(store, "uri", ""), STORE_SECONDS)
        self.checkpoints = PodCheckpoints(store, pod, ranks_per_pod, calls=self.store_calls)
        self.texts = CheckpointText(plan)  # the fingerprint document, serialized once
        # every stream's plan and checkpoint texts: the training stream, then the eval streams
        self.plans: dict[str, Plan] = {TRAIN: plan}
        self.stream_texts: dict[str, CheckpointText] = {TRAIN: self.texts}
        for stream in plan.recipe.eval:
            self.plans[stream.name] = Plan.build(eval_recipe(plan.recipe, stream.name))
            self.stream_texts[stream.name] = CheckpointText(self.plans[stream.name])
        self.admission = Admission(max_streams or default_max_streams(
            ranks_per_pod, len(plan.recipe.eval)))
        metrics.watch(self.admission)
        # --rank-processes N: the sessions live in N worker processes (remote.py)
        self.ranks = (RankProcesses(rank_processes, self.plans, knobs, prefetch,
                                    self._worker_lost) if rank_processes > 0 else None)
        self.sessions: dict[str, Session | RemoteSession] = {}
        # the metrics describe the training stream (its sources, its skipped records)
        metrics.sessions = lambda: [s for s in self.sessions.values() if not s.is_eval]
        self.handles: dict[str, _Handle] = {}  # what a client's session_id names
        self.rings: dict[str, ShmWriter | RemoteRing] = {}  # per handle
        self.last_checkpoint: dict[str, int] = {}
        self.uncommitted: set[str] = set()  # sessions whose last checkpoint is not committed
        self.serving = True
        self.started = started or Laps()  # the process's start: first microbatches logged
        self.opened_at: dict[str, float] = {}  # handle -> when its Open replied (monotonic)
        self._first_sent = False  # the first microbatch of this process was sent
        self.clients: dict[str, str] = {}  # handle -> the trainer process that opened it
        self.streams: dict[str, grpc.ServicerContext] = {}  # handle -> its Stream call
        self._lock = threading.Lock()
        self._open_locks: dict[tuple[str, int], threading.Lock] = {}

    # -- sessions ----------------------------------------------------------------------------
    def _resume(self, request: pb.OpenRequest, stream: str) -> Checkpoint | None:
        which = request.WhichOneof("resume")
        if which == "from_step" and stream != TRAIN:
            raise ConfigError(f"eval stream {stream!r} is never checkpointed, so it cannot "
                              f"resume from_step {request.from_step}; open it from_start")
        if which == "from_step":
            if self.store is None:
                raise ConfigError("resume from_step needs a checkpoint store; start the sidecar "
                                  "with --store")
            store, step = self.store, request.from_step
            return self.store_calls(  # type: ignore[no-any-return]
                f"load the checkpoint of step {step}", lambda: store.load(step))
        if which == "state_json":
            data = parse_json(request.state_json, "state_json", MismatchError)
            return Checkpoint.from_json(data, "state_json")
        return None

    def Open(self, request: pb.OpenRequest, context: grpc.ServicerContext) -> pb.OpenReply:
        with self.admission.hold("open", context):
            return self._open_call(request, context)

    def _open_call(self, request: pb.OpenRequest,
                   context: grpc.ServicerContext) -> pb.OpenReply:
        try:
            if request.protocol_version != PROTOCOL_VERSION:
                raise MismatchError(protocol_mismatch(request.protocol_version,
                                                      PROTOCOL_VERSION))
            if not self.serving:  # a draining sidecar is a restarting one: come back later
                context.abort(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down; "
                              "reconnect and re-open at your position")
            recipe = self.plan.recipe
            stream = check_stream(recipe, request.stream)
            plan = self.plans[stream]
            check_world_size(recipe.lanes, request.world_size)
            start = self._resume(request, stream)
            if start is not None:
                check_fingerprint(start.fingerprint, start.fingerprint_doc,
                                  plan.fingerprint, plan.fingerprint_doc,
                                  "the resume state" if stream == TRAIN
                                  else f"the resume state of eval stream {stream!r}",
                                  step=start.step)
            # a trainer resuming with phases appended expects the recipe its state was saved
            # with, which check_fingerprint accepted
            if request.fingerprint and request.fingerprint != plan.fingerprint and not (
                    start is not None and request.fingerprint == start.fingerprint):
                what = "recipe" if stream == TRAIN else f"eval stream {stream!r}"
                raise MismatchError(f"the trainer expects {what} fingerprint "
                                    f"{request.fingerprint[:16]}..., this sidecar serves "
                                    f"{plan.fingerprint[:16]}...")
            readers = request.readers or 1
            if request.reader >= readers:
                raise ConfigError(f"reader {request.reader} is outside 0..{readers - 1} for "
                                  f"{readers} readers of rank {request.rank}; the reader index "
                                  f"must be below readers")
            hid = uuid.uuid4().hex[:16]
            # one Open of a rank at a time: two readers opening at once must not each find no
            # session, build one, and replace the other's
            client = next((str(v) for k, v in context.invocation_metadata() or ()
                           if k == CLIENT_KEY), "")
            with self._rank_lock(stream, request.rank):
                self._check_peers(request, readers, stream, client)
                reply = (self._attach(request, hid, start, readers, stream)
                         or self._open(request, hid, start, readers, stream))
                if client:
                    with self._lock:
                        self.clients[reply.session_id] = client
                return reply
        except DatalaneError as e:
            _abort(context, e)
            raise  # unreachable: abort raises

    def _check_peers(self, request: pb.OpenRequest, readers: int, stream: str,
                     client: str) -> None:
        """Refuse an Open that would take a reader away from another trainer process that is
        streaming it: its reader index, or the whole session if the readers differ. That is
        tensor/context-parallel peers of one data-parallel rank that do not pass ``readers=``
        (each would get part of the microbatches, the other's stream ABORTED)."""
        if not client:
            return
        with self._lock:
            for h in [h for h in self.clients if h not in self.handles]:
                del self.clients[h]
            peers = [x for h, x in self.handles.items()
                     if (x.session.stream, x.session.rank) == (stream, request.rank)
                     and self.clients.get(h, client) != client
                     and h in self.streams and self.streams[h].is_active()]
        for x in peers:
            if x.session.readers != readers:
                raise ConfigError(
                    f"rank {request.rank} is read by another trainer process with readers="
                    f"{x.session.readers}; this one asks readers={readers}: every process "
                    f"that reads a data-parallel rank (its tensor/context-parallel peers) "
                    f"passes the same readers= and its own reader= index")
            if x.reader == request.reader:
                raise ConfigError(
                    f"reader {request.reader} of rank {request.rank} (readers={readers}) is "
                    f"already read by another trainer process: tensor/context-parallel peers "
                    f"that share a data-parallel rank pass readers= (how many share it) and "
                    f"each its own reader= index (or mesh=, or $DATALANE_DP_READERS), else each "
                    f"would get part of the microbatches")

    def _stream_ended(self, hid: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            if self.streams.get(hid) is context:
                del self.streams[hid]

    def _rank_lock(self, stream: str, rank: int) -> threading.Lock:
        with self._lock:
            return self._open_locks.setdefault((stream, rank), threading.Lock())

    def _open(self, request: pb.OpenRequest, hid: str, start: Checkpoint | None,
              readers: int, stream: str) -> pb.OpenReply:
        """A new session for the request's rank and stream; it replaces the rank's live one
        of that stream only once it was built (a refused request leaves it alone)."""
        t0 = time.perf_counter()
        steps = eval_steps(self.plan.recipe, stream)
        session: Session | RemoteSession
        if self.ranks is not None:
            session = self.ranks.open(hid, self.plans[stream], self.stream_texts[stream],
                                      stream, request.rank, request.world_size,
                                      request.microbatch_size, start,
                                      request.skip_microbatches, readers, steps)
        else:
            session = Session(hid, self.plans[stream], self.pool, self.knobs, request.rank,
                              request.world_size, request.microbatch_size, start,
                              request.skip_microbatches, self.prefetch, readers,
                              self.stream_texts[stream], stream, steps)
        ring = None
        try:
            ring = self._ring(request, session, hid)
            generation = session.claim(request.reader)
        except BaseException:  # neither the session nor its ring is left behind
            if ring is not None:
                ring.close()
            session.close()
            raise
        built = time.perf_counter() - t0
        with self._lock:
            old = [sid for sid, s in self.sessions.items()
                   if (s.stream, s.rank) == (stream, request.rank)]
            self.sessions[hid] = session
            self.handles[hid] = _Handle(session, request.reader, generation)
            if ring is not None:
                self.rings[hid] = ring
        for sid in old:
            self._close(sid)
        if session.lost is not None:  # its worker died after _worker_lost listed the sessions
            self._close(hid)
            raise WorkerLost(session.lost)
        t1 = time.perf_counter()
        if start is not None and stream == TRAIN:  # an eval stream has no ledger
            self.metrics.replay_seconds.observe(built)
            self._start_ledger(session)
        took = time.perf_counter() - t0
        self.metrics.open_seconds.observe(took)
        log.info("session opened", extra={"session": hid, "stream": stream,
                                          "rank": request.rank,
                                          "world_size": request.world_size,
                                          "readers": readers, "reader": request.reader,
                                          "step": session.first_step,
                                          "seconds": {"session": round(built, 3),
                                                      "ledger": round(
                                                          time.perf_counter() - t1, 3),
                                                      "open": round(took, 3)}})
        return self._reply(hid, session, session.first_step, ring)

    def _attach(self, request: pb.OpenRequest, hid: str, start: Checkpoint | None,
                readers: int, stream: str) -> pb.OpenReply | None:
        """Attach the request's reader to the rank's live session if that session serves the
        same (world size, microbatch size, readers) and still holds the requested position
        with the same lane states; None if it cannot (the caller replaces the session)."""
        with self._lock:
            live = next((s for s in self.sessions.values()
                         if (s.stream, s.rank) == (stream, request.rank)), None)
        if live is None or (live.world_size, live.microbatch_size, live.readers) != (
                request.world_size, request.microbatch_size, readers):
            return None
        if live.lost is not None:  # its rank worker died (registered after _worker_lost
            return None            # looked): replaced by a new session, never attached to
        if start is None:
            step, sources = 0, len(live.plan.recipe.sources)
            lanes = {k: lane_json(LaneState.initial(k, sources)) for k in live.lanes}
        elif all(k in start.lanes for k in live.lanes):
            step, lanes = start.step, {k: lane_json(start.lanes[k]) for k in live.lanes}
        else:
            return None
        ring = self._ring(request, live, hid)
        try:
            generation = live.attach(request.reader, step, lanes, request.skip_microbatches,
                                     wait=_ATTACH_WAIT_SECONDS)
        except BaseException:  # its worker died meanwhile: the new ring is nobody's
            if ring is not None:
                ring.close()
            raise
        with self._lock:
            ok = generation is not None and live.id in self.sessions
            replaced = [h for h, x in self.handles.items()
                        if ok and x.session is live and x.reader == request.reader]
            old_rings = [self.rings.pop(h) for h in replaced if h in self.rings]
            for h in replaced:
                del self.handles[h]  # that reader's old stream ends with ABORTED
                self.opened_at.pop(h, None)
            if ok and generation is not None:
                self.handles[hid] = _Handle(live, request.reader, generation)
                if ring is not None:
                    self.rings[hid] = ring
        if not ok:
            if generation is not None:  # the session closed meanwhile
                live.detach(request.reader, generation)
            if ring is not None:
                ring.close()
            return None
        for r in old_rings:
            r.close()
        log.info("reader attached", extra={"session": live.id, "rank": request.rank,
                                           "reader": request.reader, "step": step,
                                           "replaced": len(replaced)})
        return self._reply(hid, live, step, ring)

    def _ring(self, request: pb.OpenRequest, session: Session | RemoteSession,
              hid: str) -> ShmWriter | RemoteRing | None:
        if request.transport != pb.TRANSPORT_SHM:
            return None
        layout = session.layout  # slots of schema.slot_bytes(microbatch_size, seq_tokens)
        return session.new_ring(hid, os.path.join(self.shm_dir, f"datalane-{hid}.shm"),
                                _ring_slots(layout.slot_bytes), self.shm_mode)

    def _reply(self, hid: str, session: Session | RemoteSession, step: int,
               ring: ShmWriter | RemoteRing | None) -> pb.OpenReply:
        reply = pb.OpenReply(
            session_id=hid, protocol_version=PROTOCOL_VERSION, step=step,
            lane_start=session.lanes.start, lane_stop=session.lanes.stop,
            seq_tokens=session.plan.recipe.sequence_tokens,
            microbatches_per_step=session.per_step, fingerprint=session.plan.fingerprint,
            readers=session.readers, stream=session.stream, steps=session.steps or 0)
        session.layout.announce(reply)
        if ring is not None:
            reply.shm_path, reply.shm_bytes = ring.path, ring.size
        with self._lock:
            self.opened_at[hid] = time.monotonic()
        return reply

    def _first_delivery(self, hid: str, session: Session | RemoteSession) -> None:
        """Log and measure the first microbatch sent on handle ``hid`` (and the process's
        first: how long after its start a restarted sidecar served)."""
        with self._lock:
            opened = self.opened_at.pop(hid, None)
            first, self._first_sent = not self._first_sent, True
        if opened is None:
            return
        waited = time.monotonic() - opened
        self.metrics.first_microbatch.observe(waited)
        extra: dict[str, Any] = {"session": session.id, "rank": session.rank,
                                 "stream": session.stream,
                                 "seconds_after_open": round(waited, 3)}
        if first:
            extra["seconds_after_start"] = round(self.started.since_start(), 3)
        log.info("first microbatch sent", extra=extra)

    def _start_ledger(self, session: Session | RemoteSession) -> None:
        """The next checkpoint's ledger starts at the newest committed step at or before the
        session's first step; when that is earlier (a restarted sidecar, a trainer resumed
        from its own position), the digests in between are rebuilt on the side. Found on a
        thread of its own after the Open replied: a store that hangs delays the session's
        first checkpoint (which waits for ``backfilled``), never its batches."""
        if self.store is None:
            return
        session.backfilled.clear()
        threading.Thread(target=self._find_ledger_start, args=(session,), daemon=True,
                         name=f"ledger-{session.id}").start()

    def _find_ledger_start(self, session: Session | RemoteSession) -> None:
        store = self.store
        assert store is not None
        rebuilding = False
        try:
            since = backfill_from(self.store_calls("list the committed checkpoints",
                                                   store.committed_steps),
                                  session.first_step)
            with self._lock:
                if since is None or session.id not in self.sessions:  # none, or closed since
                    return
                self.last_checkpoint[session.id] = since

            def load() -> Checkpoint:
                return self.store_calls(  # type: ignore[no-any-return]
                    f"load the checkpoint of step {since}",
                    lambda: store.load(since, session.lanes, fingerprint=self.plan.fingerprint,
                                       fingerprint_doc=self.plan.fingerprint_doc))

            session.backfill(since, load)  # sets backfilled once the rebuild ended
            rebuilding = True
        except DatalaneError as e:
            log.warning("cannot list committed checkpoints to start the ledger: %s", e)
        finally:
            if not rebuilding:
                session.backfilled.set()

    def _close(self, sid: str) -> None:
        """Close session ``sid`` and every reader's handle of it."""
        with self._lock:
            session = self.sessions.pop(sid, None)
            hids = [h for h, x in self.handles.items() if x.session is session]
            for h in hids:
                del self.handles[h]
                self.opened_at.pop(h, None)
            rings = [self.rings.pop(h) for h in hids if h in self.rings]
            self.last_checkpoint.pop(sid, None)
            self.uncommitted.discard(sid)
        if session is not None:
            session.close()
        for ring in rings:
            ring.close()

    def _worker_lost(self, worker: RankWorker) -> None:
        """A rank worker process died: its sessions are closed like a restarted sidecar's
        (their streams end UNAVAILABLE, a checkpoint finds no session), and the next Open of
        their ranks starts a new worker."""
        with self._lock:
            lost = [sid for sid, s in self.sessions.items()
                    if isinstance(s, RemoteSession) and s.worker is worker]
        for sid in lost:
            self._close(sid)

    def _handle(self, hid: str, context: grpc.ServicerContext) -> _Handle:
        with self._lock:
            handle = self.handles.get(hid)
        if handle is None:
            # the one NOT_FOUND that means "re-open": storage errors are NOT_FOUND too
            context.set_trailing_metadata(((NO_SESSION_KEY, "1"),))
            context.abort(grpc.StatusCode.NOT_FOUND, f"no session {hid!r}; open one first "
                          f"(the sidecar may have restarted)")
        assert handle is not None
        return handle

    # -- streaming ---------------------------------------------------------------------------
    def Stream(self, request_iterator: Iterator[pb.Ack],
               context: grpc.ServicerContext) -> Iterator[pb.Delivery]:
        with self.admission.hold("stream", context):
            yield from self._stream(request_iterator, context)

    def _stream(self, request_iterator: Iterator[pb.Ack],
                context: grpc.ServicerContext) -> Iterator[pb.Delivery]:
        first = next(request_iterator, None)
        if first is None:
            return
        hid = first.session_id
        handle = self._handle(hid, context)
        session, reader, generation = handle.session, handle.reader, handle.generation
        ring = self.rings.get(hid)
        with self._lock:
            self.streams[hid] = context  # which readers are being read (_check_peers)
        context.add_callback(lambda: self._stream_ended(hid, context))

        def acks() -> None:
            try:
                for ack in request_iterator:
                    if ring is not None and ack.release:
                        ring.release(list(ack.release))
                    if ack.has_position:
                        session.acked_by(reader, generation, (int(ack.step), ack.consumed))
            except grpc.RpcError:
                pass

        threading.Thread(target=acks, daemon=True).start()
        while context.is_active():
            # The stream is endless (after the data ends, steps are padding with `ended`
            # set), so it never finishes with OK: a trainer must not take a sidecar that
            # stops or a session that was replaced for the end of its data.
            if not self.serving:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the sidecar is shutting down; "
                              "reconnect and re-open at your position")
            if session.lost is not None:  # its rank worker died: as a sidecar restart
                context.abort(grpc.StatusCode.UNAVAILABLE, session.lost)
            if session.id not in self.sessions:
                context.abort(grpc.StatusCode.ABORTED,
                              f"session {session.id} of rank {session.rank} was closed (the "
                              f"rank was opened again, or the session closed)")
            if hid not in self.handles:
                context.abort(grpc.StatusCode.ABORTED,
                              f"reader {reader} of session {session.id} of rank "
                              f"{session.rank} was opened again (or closed); this stream "
                              f"ends")
            try:
                # the microbatches ready, placed in the reader's ring (or packed inline)
                # where the session lives; more than one ride in a message when they can
                items = session.gather(reader, generation, ring, timeout=0.2)  # type: ignore[arg-type]
                if not items and session.exhausted(reader):
                    return  # an eval stream's last microbatch was sent: the evaluation ends
            except RingClosed as e:
                if context.is_active():
                    context.abort(grpc.StatusCode.UNAVAILABLE if not self.serving
                                  else grpc.StatusCode.ABORTED, str(e))
                return
            except DatalaneError as e:
                if session.lost is not None:
                    context.abort(grpc.StatusCode.UNAVAILABLE, session.lost)
                if session.id not in self.sessions or hid not in self.handles:
                    continue  # closed or replaced meanwhile (in its worker first): ABORTED
                _abort(context, e)
                return
            if not items:
                continue
            delivery = pb.Delivery()
            for it in items:
                msg = delivery.items.add(step=it.step, index=it.index, sequences=it.rows,
                                         ended=it.ended, step_tokens=it.step_tokens,
                                         state_json=it.state_json)
                for lane, digest in it.lane_digests.items():
                    msg.lane_digests[lane] = digest
                if it.slot is not None:
                    msg.slot, msg.offset = it.slot, it.offset
                else:
                    msg.columns.extend(it.columns or ())
                self.metrics.delivered(it.nbytes, it.tokens, it.depth, session.stream)
            session.sent_to(reader, generation, (items[-1].step, items[-1].index))
            if hid in self.opened_at:
                self._first_delivery(hid, session)
            yield delivery

    # -- checkpoints -------------------------------------------------------------------------
    def Checkpoint(self, request: pb.CheckpointRequest,
                   context: grpc.ServicerContext) -> pb.CheckpointReply:
        with self.admission.hold("checkpoint", context):
            return self._checkpoint(request, context)

    def _checkpoint(self, request: pb.CheckpointRequest,
                    context: grpc.ServicerContext) -> pb.CheckpointReply:
        # the readers of one session all ask: the pod object counts the session once
        session = self._handle(request.session_id, context).session
        if session.is_eval:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"eval stream {session.stream!r} is never checkpointed: every "
                          f"evaluation opens it from the start; checkpoint the training "
                          f"stream's session")
        if not session.backfilled.wait(_BACKFILL_WAIT_SECONDS):
            log.warning("the ledger of rank %d is still being rebuilt; checkpoint %d goes "
                        "without it", session.rank, request.step)
        try:
            state = session.state_at(request.step)
            since = self.last_checkpoint.get(session.id, session.first_step)
            if session.id in self.uncommitted and self.store is not None:
                # this pod's last object did not complete its step, but a later pod may
                # have: the ledger then starts there (ledger.ledger_since)
                newer = ledger_since(since, request.step, self._committed_steps())
                if newer != since:
                    since = self.last_checkpoint[session.id] = newer
                    session.forget_before(since)
            steps = ledger_steps(since, request.step)
            digests = session.digests_between(steps.start, steps.stop)
            with self._lock:
                closed = not self.serving or session.id not in self.sessions
            if closed:
                # closed (the sidecar stopping, the rank opened again) while this request
                # waited: its ledger start is gone with it, and an object written now would
                # commit the step with a gap in the ledger. The client asks again.
                raise StorageError(f"the session of rank {session.rank} closed while the "
                                   f"checkpoint of step {request.step} waited; ask again",
                                   transient=True)
            saved = self.checkpoints.save(request.step, session.id, state, digests)
        except DatalaneError as e:
            _abort(context, e)
            raise
        if saved.error is not None:
            # a store error keeps its meaning (a lane in two objects is no reason to retry),
            # and is marked as the store's: the client raises it instead of asking again
            error = saved.error
            if saved.from_store:
                transient = isinstance(error, StorageError) and error.transient
                context.set_trailing_metadata(
                    ((STORE_ERROR_KEY, "transient" if transient else "permanent"),))
            if isinstance(error, DatalaneError):
                _abort(context, error, f"checkpoint of step {request.step} failed: ")
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"checkpoint of step {request.step} failed: {saved.error}")
        after = next_since(request.step, saved.committed, self.store is not None)
        if after is not None:
            # the ledger of the next checkpoint starts here; until a commit, keep everything
            self.last_checkpoint[session.id] = after
            self.uncommitted.discard(session.id)
            try:
                session.forget_before(after)
            except DatalaneError:  # its rank worker died since: the step was saved anyway
                if session.lost is None:
                    raise
        else:
            self.uncommitted.add(session.id)
        return pb.CheckpointReply(step=request.step, object=saved.object,
                                  committed=saved.committed, state_json=state)

    def _committed_steps(self) -> list[int]:
        """The store's committed steps; none when it cannot list them (the ledger is then
        trimmed at a later checkpoint, and the write that follows reports the store)."""
        store = self.store
        assert store is not None
        try:
            return list(self.store_calls("list the committed checkpoints",
                                         store.committed_steps))
        except DatalaneError as e:
            log.warning("cannot list committed checkpoints: %s", e)
            return []

    def Close(self, request: pb.CloseRequest, context: grpc.ServicerContext) -> pb.CloseReply:
        """Detach the handle's reader; the session closes with its last attached reader."""
        with self._lock:
            handle = self.handles.pop(request.session_id, None)
            ring = self.rings.pop(request.session_id, None)
            self.opened_at.pop(request.session_id, None)
            last = handle is not None and not any(
                x.session is handle.session for x in self.handles.values())
        if ring is not None:
            ring.close()
        if handle is not None:
            handle.session.detach(handle.reader, handle.generation)
            if last:
                self._close(handle.session.id)
        return pb.CloseReply()

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthReply:
        reply = pb.HealthReply(serving=self.serving, protocol_version=PROTOCOL_VERSION,
                               fingerprint=self.plan.fingerprint, lanes=self.plan.recipe.lanes)
        announce_schema(reply, self.plan.schema)
        return reply

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsReply:
        with self._lock:
            live = list(self.sessions.items())
        sessions = {}
        for sid, s in live:
            try:
                sessions[sid] = s.describe()
            except DatalaneError:  # closed meanwhile (its rank worker died)
                continue
        out: dict[str, Any] = {"fingerprint": self.plan.fingerprint, "sessions": sessions}
        if self.ranks is not None:  # each rank worker's pid and resident memory
            out["rank_workers"] = self.ranks.describe()
        elif self.pool.processes:  # the map processes' pids, memory, starts and losses
            out["map_processes"] = self.pool.describe_children()
        return pb.StatsReply(json=json.dumps(out))

    # -- shutdown ----------------------------------------------------------------------------
    def drain(self) -> dict[int, dict[str, Any]]:
        """Stop serving; return, per rank, where its trainer stands as far as the sidecar
        knows: the last position the client acknowledged (it may lag the trainer by the
        acknowledgements in flight; the client's own ``state_dict`` is always exact)."""
        self.serving = False
        self.checkpoints.abort("the sidecar is shutting down")
        out: dict[int, dict[str, Any]] = {}
        with self._lock:
            sessions = list(self.sessions.items())
        for _, session in sessions:
            if session.is_eval:  # an evaluation starts again from its beginning
                continue
            try:
                step, consumed = session.acked or (session.first_step, session.first_skip)
                out[session.rank] = {"state": json.loads(session.state_at(step, timeout=1.0)),
                                     "skip_microbatches": consumed,
                                     "world_size": session.world_size,
                                     "delivered_through": list(session.sent or ())}
            except DatalaneError as e:
                log.warning("cannot persist the resume point of rank %d: %s", session.rank, e)
        for sid, _ in sessions:
            self._close(sid)
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.ranks is not None:
            self.ranks.stop()
        return out

"""The trainer's client of the pod's sidecar (docs/client.md).

``SidecarLoader`` opens a session for its rank over the Unix socket, streams microbatches as
numpy arrays (from the shared-memory ring or inline bytes) and tracks its position. The reply
to Open announces the recipe's sample schema and where each column lies
(:class:`datalane.wire.layout.Layout`); the client reads every column by it and derives no
offset or dtype itself. A sidecar of another wire protocol version is refused with a
MismatchError naming both versions and the side to upgrade. If the
sidecar goes away (restart, ``kill -9``), it waits for the socket to serve again and re-opens
the session at its exact position from the checkpoint it carries, so no sequence is lost or
repeated. Needs only ``grpcio`` and ``numpy``.

``SidecarLoader(..., stream="<name>")`` reads an eval stream of the recipe instead (its
``eval:`` list): every iteration is one evaluation, exactly the stream's ``steps`` steps from
step 0 (the rank's lanes of each, as for training), and then the iterator ends; ``restart()``
goes back to step 0 at once. An eval loader has no state to save or load: it always starts
from the beginning (it still rides through a sidecar restart inside an evaluation).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import sys
import time
import uuid
import weakref
from collections.abc import Generator, Iterator
from itertools import chain
from socket import gethostname
from typing import Any

import grpc

from datalane.client import dataparallel
from datalane.client.batch import Batch
from datalane.client.position import Position
from datalane.spec.errors import ConfigError, DatalaneError, MismatchError, StorageError
from datalane.spec.evals import NAME_PATTERN, TRAIN
from datalane.spec.lanes import lanes_of_rank
from datalane.spec.schema import SampleSchema
from datalane.spec.state import check_step
from datalane.wire import (
    CLIENT_KEY,
    NO_SESSION_KEY,
    PROTOCOL_VERSION,
    STORE_ERROR_KEY,
    protocol_mismatch,
)
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from datalane.wire.layout import Layout, announced_schema
from datalane.wire.shm import ShmReader

__all__ = ["SidecarLoader"]

log = logging.getLogger("datalane.client")

# A call that failed for one of these codes may succeed after a reconnect: the sidecar is
# restarting or draining (UNAVAILABLE), the connection broke mid-call (CANCELLED, or UNKNOWN
# without a servicer exception). "No session" (NOT_FOUND marked by the sidecar) is decided in
# `_retryable`; every other code is a cause that a retry does not remove.
_RECONNECT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
_OPTIONS = [("grpc.max_send_message_length", 256 << 20),
            ("grpc.max_receive_message_length", 256 << 20),
            # a restarting sidecar is back within a second: retry the socket every 50-250 ms
            # instead of gRPC's default backoff of 1 s growing to 2 min
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 250)]


_LIVE: weakref.WeakSet[SidecarLoader] = weakref.WeakSet()
_NONCE = uuid.uuid4().hex[:12]


def _client_id() -> str:
    """This trainer process, as Open names it to the sidecar (CLIENT_KEY): a forked process
    is another one."""
    return f"{gethostname()}/{os.getpid()}/{_NONCE}"


@atexit.register
def _close_all() -> None:
    """Close the loaders a trainer left open, while gRPC still runs (atexit comes before the
    interpreter finalizes objects): a worker must exit, closed or not, or it keeps the job
    Running and its GPUs held.

    Their iterators are closed first, here: one still referenced at exit (a torch DataLoader's
    iterator held by the trainer) would otherwise run its cleanup while the interpreter
    finalizes, after the modules it uses were torn down, and print "Exception ignored in:
    <generator object SidecarLoader._stream ...> ... 'NoneType' object has no attribute
    'suppress'" on every exit."""
    for loader in list(_LIVE):
        for iterator in list(loader._iterators):
            try:
                iterator.close()
            except Exception:  # one running on another thread: it ends with its thread
                pass
        try:
            loader.close()
        except Exception:  # exiting anyway: a close that fails must not keep the process
            pass


class SidecarLoader:
    """Microbatches of one rank, served by the sidecar on ``socket``."""

    def __init__(self, socket: str | None = None, *, rank: int | None = None,
                 world_size: int | None = None, microbatch_size: int = 1,
                 transport: str = "shm", copy: bool = True, resume_step: int | None = None,
                 reconnect_timeout: float = 120.0, open_timeout: float = 60.0,
                 mesh: Any = None, readers: int | None = None,
                 reader: int | None = None, stream: str = TRAIN) -> None:
        self.socket = socket or os.environ.get("DATALANE_SOCKET", "")
        if not self.socket:
            raise ConfigError("no sidecar socket: pass socket= or set $DATALANE_SOCKET")
        if transport not in ("shm", "inline"):
            raise ConfigError(f"transport {transport!r} is not 'shm' or 'inline'")
        dp = dataparallel.resolve(rank, world_size, mesh=mesh, readers=readers, reader=reader)
        self.rank, self.world_size = dp.rank, dp.world_size
        self.readers, self.reader = dp.readers, dp.reader
        if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int) \
                or microbatch_size < 1:
            raise ConfigError(f"microbatch size must be a positive integer, got "
                              f"{microbatch_size!r}")
        self.microbatch_size = microbatch_size
        if not isinstance(stream, str) or not re.fullmatch(NAME_PATTERN, stream):
            raise ConfigError(f"stream {stream!r} is not a stream name ({TRAIN!r} or the name "
                              f"of one of the recipe's eval streams)")
        self.stream = stream
        self.steps: int | None = None  # an eval stream's steps, from the reply to Open
        if resume_step is not None and stream != TRAIN:
            raise ConfigError(f"eval stream {stream!r} always starts at step 0; it takes no "
                              f"resume_step")
        self.transport = transport
        self.copy = copy
        self.reconnect_timeout = reconnect_timeout
        self.open_timeout = open_timeout
        self.position = Position(world_size=self.world_size, microbatch_size=microbatch_size)
        self._resume_step = None if resume_step is None else check_step(resume_step,
                                                                          "resume_step")
        self._channel: grpc.Channel | None = None
        self._stub: pbg.DataLaneStub | None = None
        self._session = ""
        self._lanes_total = 0
        self._layout: Layout | None = None
        self._generation = 0
        self._per_step = 0
        # a session opened before the first iteration (to answer per_step) and the position
        # it was opened at: the first iteration streams from it if the position is unchanged
        self._early: tuple[pb.OpenReply, tuple[int, int, str | None]] | None = None
        self.reconnects = 0
        self.last_resume: dict[str, float] | None = None  # seconds of the last resume, by part
        self._active: tuple[Any, queue.Queue[pb.Ack | None]] | None = None
        self._parked = ""  # a session checkpoint() opened, that no stream reads from yet
        self._iterators: weakref.WeakSet[Generator[Batch, None, None]] = weakref.WeakSet()
        _LIVE.add(self)

    def _health(self) -> pb.HealthReply:
        """The sidecar's Health, of this client's protocol version (else MismatchError)."""
        if self._stub is None:
            self._connect(time.monotonic() + self.open_timeout)
        assert self._stub is not None
        try:
            reply: pb.HealthReply = self._stub.Health(pb.HealthRequest(),
                                                      timeout=self.open_timeout,
                                                      wait_for_ready=True)
        except grpc.RpcError as e:
            raise _error(e) from None
        self._check_version(reply.protocol_version)
        return reply

    def _check_version(self, theirs: int) -> None:
        if theirs != PROTOCOL_VERSION:
            raise MismatchError(f"the sidecar at {self.socket}: "
                                f"{protocol_mismatch(PROTOCOL_VERSION, theirs)}")

    @property
    def per_step(self) -> int:
        """Microbatches of this rank in one step (the same on every rank), as the sidecar
        serves them. Known before the first microbatch: the first read opens the session
        (waiting up to ``open_timeout`` for the sidecar), and the first iteration streams
        from that session."""
        if not self._per_step:
            deadline = time.monotonic() + self.open_timeout
            while True:
                try:
                    self._connect(deadline)
                    reply = self._open()
                    break
                except StorageError as e:
                    if not e.transient or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.1)
            self._early = (reply, self._position_key())
        return self._per_step

    def _position_key(self) -> tuple[int, int, str | None]:
        pos = self.position
        return pos.step, pos.consumed, pos.state_json

    @property
    def lanes_total(self) -> int:
        """The recipe's lane count, as the sidecar serves it."""
        if not self._lanes_total:
            reply = self._health()
            if not reply.lanes:
                raise MismatchError(f"the sidecar at {self.socket} does not report its lane "
                                    f"count (an older version); upgrade it")
            self._lanes_total = int(reply.lanes)
        return self._lanes_total

    @property
    def lanes(self) -> range:
        """The lanes of this loader's data-parallel rank."""
        return lanes_of_rank(self.lanes_total, self.world_size, self.rank)

    @property
    def schema(self) -> SampleSchema:
        """The recipe's sample schema, as the sidecar announces it (in the reply to Open;
        before the first one, in its Health)."""
        if self._layout is not None:
            return self._layout.schema
        return announced_schema(self._health(), f"the Health of the sidecar at {self.socket}")

    # -- connection --------------------------------------------------------------------------
    def _connect(self, deadline: float) -> None:
        self._disconnect()
        target = f"unix://{os.path.abspath(self.socket)}"
        while True:
            channel = grpc.insecure_channel(target, options=_OPTIONS)
            try:
                grpc.channel_ready_future(channel).result(
                    timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                self._channel, self._stub = channel, pbg.DataLaneStub(channel)
                return
            except grpc.FutureTimeoutError:
                channel.close()
                if time.monotonic() >= deadline:
                    raise StorageError(f"the sidecar at {self.socket} did not answer",
                                       transient=True) from None

    def _disconnect(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def _open(self) -> pb.OpenReply:
        assert self._stub is not None
        pos = self.position
        req = pb.OpenRequest(protocol_version=PROTOCOL_VERSION, rank=self.rank,
                             world_size=self.world_size, microbatch_size=self.microbatch_size,
                             skip_microbatches=pos.consumed, fingerprint=pos.fingerprint,
                             readers=self.readers, reader=self.reader,
                             stream="" if self.stream == TRAIN else self.stream,
                             transport=pb.TRANSPORT_SHM if self.transport == "shm"
                             else pb.TRANSPORT_INLINE)
        if pos.state_json is not None:
            req.state_json = pos.state_json
        elif self._resume_step is not None:
            req.from_step = self._resume_step
        else:
            req.from_start = True
        try:
            reply: pb.OpenReply = self._stub.Open(req, timeout=self.open_timeout,
                                                  metadata=((CLIENT_KEY, _client_id()),))
        except grpc.RpcError as e:
            raise _error(e) from None
        self._session = reply.session_id
        try:
            self._layout = self._announced(reply)
        except MismatchError:
            self.close()
            raise
        served = reply.stream or TRAIN  # a sidecar before eval streams answers ""
        if served != self.stream or (self.stream != TRAIN and not reply.steps):
            self.close()
            raise MismatchError(f"the sidecar at {self.socket} serves stream {served!r} to a "
                                f"loader of stream {self.stream!r}: it predates eval streams; "
                                f"upgrade it")
        self.steps = int(reply.steps) if self.stream != TRAIN else None
        if self.readers > 1 and reply.readers != self.readers:
            self.close()
            raise MismatchError(f"the sidecar at {self.socket} serves {reply.readers or 1} "
                                f"reader(s) per session, not {self.readers}: it predates "
                                f"shared sessions; upgrade it")
        self._per_step = reply.microbatches_per_step
        if pos.state_json is None and self._resume_step is not None:
            pos.step = int(reply.step)
        pos.fingerprint = reply.fingerprint
        return reply

    def _announced(self, reply: pb.OpenReply) -> Layout:
        """The schema and layout the reply announces, checked: the protocol version, then
        the announcement (:mod:`datalane.wire.layout`), then what this client reads of it
        (microbatch_size rows, the two text columns)."""
        where = f"the reply to Open of the sidecar at {self.socket}"
        self._check_version(reply.protocol_version)
        layout = Layout.announced(reply, where)
        layout.check_client(self.microbatch_size, where)
        return layout

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        """Microbatches from the position on, riding through sidecar restarts (see
        :meth:`_iterate`); the iterator is closed at exit if the trainer left it open."""
        iterator = self._iterate()
        self._iterators.add(iterator)
        return iterator

    def _iterate(self) -> Generator[Batch, None, None]:
        """Microbatches from the position on, riding through sidecar restarts.

        A failure whose cause may pass (the sidecar restarting or draining, its session gone,
        a transient storage error) re-opens at the exact position; any other is raised. The
        retries are bounded: ``open_timeout`` for the first session, then
        ``reconnect_timeout`` from the last microbatch received, so a sidecar that answers
        but cannot serve fails the trainer with the last error instead of looping forever.
        Starting another iterator continues at the position and retires this one.

        On an eval stream each iterator is one evaluation: it starts at step 0 and ends after
        the stream's last microbatch (closing the sidecar's session of it).
        """
        self._generation += 1
        generation = self._generation
        if self.stream != TRAIN:
            self._rewind()
        bound, name = self.open_timeout, "open_timeout"
        deadline = time.monotonic() + bound
        last: BaseException | None = None
        broke: float | None = None  # when the stream last broke (monotonic), until resumed
        attempts = 0
        while True:
            if time.monotonic() >= deadline:
                raise StorageError(f"the sidecar at {self.socket} did not serve rank "
                                   f"{self.rank} of {self.world_size} within {name}={bound:g} s"
                                   f"; last error: {last}")
            progressed = False
            try:
                t0 = time.monotonic()
                early, self._early = self._early, None
                if early is not None and early[1] == self._position_key():
                    reply = early[0]  # opened by per_step, at this very position
                    t1 = t2 = time.monotonic()
                else:
                    self._connect(deadline)
                    t1 = time.monotonic()
                    reply = self._open()
                    t2 = time.monotonic()
                self._parked = ""
                # the stream is endless; if it finishes without an error anyway (a sidecar
                # of an older version that stops serving), re-open at the position rather
                # than end the trainer's data as if it had run out
                for batch in self._stream(reply):
                    if broke is not None:
                        self._resumed(batch, {"waiting": t0 - broke, "connect": t1 - t0,
                                              "open": t2 - t1,
                                              "first_microbatch": time.monotonic() - t2,
                                              "total": time.monotonic() - broke}, attempts)
                        broke, attempts = None, 0
                    progressed = True
                    yield batch
                    if self._generation != generation:
                        raise ConfigError("this iterator of the loader was retired: another "
                                          "iterator was started and continues at the "
                                          "position; iterate one at a time")
                if self._evaluated():
                    self._end_session()
                    return
            except grpc.RpcError as e:
                if self._generation != generation:
                    raise ConfigError("the loader was closed (or another iterator of it "
                                      "started)") from None
                if not _retryable(e):
                    raise _error(e) from None
                last = _error(e)
            except StorageError as e:
                if not e.transient:
                    raise
                last = e
            if progressed:
                bound, name = self.reconnect_timeout, "reconnect_timeout"
                deadline = time.monotonic() + bound
            if broke is None:
                broke = time.monotonic()
            attempts += 1
            self.reconnects += 1
            # a short pause whatever the count: a sidecar restarting is waited for by the
            # channel's own backoff (50-250 ms), never by a sleep that grows
            time.sleep(min(0.25, 0.02 * attempts))

    def _resumed(self, batch: Batch, seconds: dict[str, float], attempts: int) -> None:
        """Record and log where the time between a broken stream and its next microbatch
        went (``last_resume``; docs/operator.md, Restarts)."""
        self.last_resume = {k: round(v, 3) for k, v in seconds.items()}
        log.info("rank %d: stream resumed at step %d index %d after %.2f s, %d attempt(s): "
                 "waiting %.2f s, connect %.2f s, open %.2f s, first microbatch %.2f s",
                 self.rank, batch.step, batch.index, seconds["total"], attempts,
                 seconds["waiting"], seconds["connect"], seconds["open"],
                 seconds["first_microbatch"])

    def _stream(self, reply: pb.OpenReply) -> Iterator[Batch]:
        assert self._stub is not None
        acks: queue.Queue[pb.Ack | None] = queue.Queue()
        acks.put(pb.Ack(session_id=reply.session_id))

        def requests() -> Iterator[pb.Ack]:
            while (ack := acks.get()) is not None:
                yield ack

        layout = self._layout
        assert layout is not None  # set by _open
        schema = layout.schema
        where = f"a microbatch from the sidecar at {self.socket}"
        reader = (ShmReader(reply.shm_path, reply.shm_bytes, layout) if reply.shm_path
                  else None)
        # Released slots go back in batches: one Ack per quarter of the ring instead of one per
        # microbatch (each Ack is a message on the request stream and a wakeup on both sides).
        # The client owns at most `per_ack` slots (pending + the one held with copy=False), fewer
        # than the ring's, so the sidecar always has a free slot for the next microbatch.
        per_ack = max(1, reader.slots // 4) if reader is not None else 1
        pending: list[int] = []
        calls = self._stub.Stream(requests())
        self._active = (calls, acks)
        held: int | None = None
        try:
            last = ((self.steps - 1, self._per_step - 1) if self.steps is not None
                    else None)  # an eval stream's last microbatch
            for msg in chain.from_iterable(d.items for d in calls):  # deliveries hold several
                if msg.sequences != layout.rows:
                    raise MismatchError(f"{where} (step {msg.step}, index {msg.index}) has "
                                        f"{msg.sequences} sequences; the layout announced "
                                        f"{layout.rows}")
                if reader is not None:
                    columns = reader.columns(msg.offset)
                    if self.copy:
                        columns = {k: a.copy() for k, a in columns.items()}
                        pending.append(msg.slot)
                    else:
                        if held is not None:
                            pending.append(held)
                        held = msg.slot
                    if len(pending) >= per_ack:
                        acks.put(self._ack(pending, msg))
                        pending = []
                else:
                    columns = layout.unpack(msg.columns, where)
                    if self.copy:
                        columns = {k: a.copy() for k, a in columns.items()}
                if msg.index + 1 == self._per_step:  # the position, at least once per step
                    acks.put(self._ack(pending, msg))
                    pending = []
                batch = Batch(int(msg.step), msg.index, columns, msg.ended,
                              dict(msg.lane_digests), schema, int(msg.step_tokens))
                self.position.advance(int(msg.step), msg.index, self._per_step,
                                      msg.state_json or None)
                yield batch
                if (batch.step, batch.index) == last:
                    return
        finally:
            self._active = None
            acks.put(None)
            # a generator left open finalizes at interpreter exit, when gRPC's threads are
            # gone and a cancel can block forever; the atexit hook has cancelled it already
            if not sys.is_finalizing():
                calls.cancel()
            if reader is not None:
                reader.close()

    def _ack(self, release: list[int], msg: pb.Microbatch) -> pb.Ack:
        """An Ack releasing ``release`` and reporting the position once ``msg`` is handed out
        (so it never claims more than the trainer can have received)."""
        step, consumed = int(msg.step), msg.index + 1
        if consumed >= self._per_step:
            step, consumed = step + 1, 0
        return pb.Ack(release=release, has_position=True, step=step, consumed=consumed)

    # -- state -------------------------------------------------------------------------------
    # -- eval streams ------------------------------------------------------------------------
    def restart(self) -> None:
        """Go back to step 0 of the eval stream: the next microbatch is the evaluation's first
        (an open iterator is retired; the next ``iter()`` starts the evaluation again)."""
        self._eval_only("restart()")
        self._generation += 1
        self._end_session()
        self._rewind()

    def _rewind(self) -> None:
        """Position at step 0 (keeping the stream's fingerprint: a sidecar restarted with
        another eval stream between evaluations is refused instead of evaluating on it)."""
        self.position = Position(fingerprint=self.position.fingerprint,
                                 world_size=self.world_size,
                                 microbatch_size=self.microbatch_size)

    def _evaluated(self) -> bool:
        """Whether the position is past an eval stream's last step."""
        return self.steps is not None and self.position.step >= self.steps

    def _end_session(self) -> None:
        """Close the stream and the sidecar's session of it (the connection stays)."""
        active, self._active = self._active, None
        self._early = None
        if active is not None:
            calls, acks = active
            acks.put(None)
            calls.cancel()
        if self._stub is not None and self._session:
            try:
                self._stub.Close(pb.CloseRequest(session_id=self._session), timeout=5)
            except grpc.RpcError:
                pass
        self._session = ""

    def _eval_only(self, what: str) -> None:
        if self.stream == TRAIN:
            raise ConfigError(f"{what} is for eval streams; the training stream resumes "
                              f"with load_state_dict()")

    def _train_only(self, what: str) -> None:
        if self.stream != TRAIN:
            raise ConfigError(f"eval stream {self.stream!r} has no {what}: it is never "
                              f"checkpointed, and every evaluation starts at step 0 "
                              f"(restart() goes back there)")

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position plus this rank's lane states: enough to resume anywhere, even without
        storage. Compatible with ``torch.distributed.checkpoint`` (plain JSON types)."""
        self._train_only("state_dict()")
        return self.position.to_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_only("load_state_dict()")
        pos = Position.from_state(state)
        pos.check_layout(self.world_size, self.microbatch_size)
        pos.world_size, pos.microbatch_size = self.world_size, self.microbatch_size
        self.position = pos

    def checkpoint(self, step: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
        """Ask the sidecar to persist this rank's lanes at a step boundary (default: the
        current position, which must be a boundary) to its checkpoint store."""
        self._train_only("checkpoint()")
        if step is None:
            if self.position.consumed:
                raise ConfigError(f"the trainer is inside step {self.position.step} "
                                  f"({self.position.consumed} microbatches in); checkpoint at "
                                  f"a step boundary")
            step = self.position.step
        if self._stub is None:
            raise ConfigError("not connected: iterate the loader first")
        deadline = time.monotonic() + timeout
        pos = self.position
        if self._session == self._parked and (pos.step, pos.consumed) == (step, 0):
            # the session was opened by an earlier checkpoint after a restart, while the data
            # stream still drained what the old sidecar had sent: nobody reads it, so it is
            # parked a prefetch past where it started. Open one at this boundary instead.
            try:
                self._open()
                self._parked = self._session
            except StorageError as e:
                if not e.transient:
                    raise
        while True:
            try:
                reply = self._checkpoint(step, max(0.1, deadline - time.monotonic()))
                break
            except grpc.RpcError as e:
                # a sidecar restarting during the call ("Stream removed", UNAVAILABLE) is
                # waited for, as the data stream does; a session it no longer has is opened
                # again at the position (the stream re-opens on the next microbatch); any
                # other cause - a storage error among them - is the caller's to see, and
                # re-opens nothing
                if not _retryable(e) or _store_error(e) or time.monotonic() >= deadline:
                    raise _error(e) from None
                if _no_session(e):
                    try:
                        self._open()
                        self._parked = self._session
                    except DatalaneError as oe:
                        if not getattr(oe, "transient", False):
                            raise
                time.sleep(0.05)
        return {"step": int(reply.step), "object": reply.object, "committed": reply.committed}

    def _checkpoint(self, step: int, timeout: float) -> pb.CheckpointReply:
        assert self._stub is not None
        # wait_for_ready: a sidecar that is restarting gets until `timeout` to serve again
        reply: pb.CheckpointReply = self._stub.Checkpoint(
            pb.CheckpointRequest(session_id=self._session, step=step), timeout=timeout,
            wait_for_ready=True)
        return reply

    def stats(self) -> dict[str, Any]:
        if self._stub is None:
            raise ConfigError("not connected: iterate the loader first")
        out: dict[str, Any] = json.loads(self._stub.Stats(pb.StatsRequest(), timeout=10).json)
        return out

    def close(self) -> None:
        """End the session and the stream (an open iterator stops at its next item)."""
        self._generation += 1
        self._end_session()
        self._disconnect()

    def __enter__(self) -> SidecarLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _metadata(e: grpc.RpcError, key: str) -> str | None:
    meta = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    return next((str(v) for k, v in meta or () if k == key), None)


def _no_session(e: grpc.RpcError) -> bool:
    return e.code() == grpc.StatusCode.NOT_FOUND and _metadata(e, NO_SESSION_KEY) is not None


def _store_error(e: grpc.RpcError) -> str | None:
    """"transient" or "permanent" if the checkpoint store failed the call (the sidecar
    retried it already, within its bound), else None."""
    return _metadata(e, STORE_ERROR_KEY)


def _retryable(e: grpc.RpcError) -> bool:
    """Whether the cause of a failed call can pass by itself (a restart, a broken stream)."""
    code = e.code()
    if code in _RECONNECT or _no_session(e):
        return True
    # UNKNOWN is both a transport that broke mid-stream and an exception that escaped the
    # sidecar's servicer ("Exception calling application" / "Exception iterating responses"):
    # only the first goes away with a retry
    return code == grpc.StatusCode.UNKNOWN and not (e.details() or "").startswith("Exception")


def _error(e: grpc.RpcError) -> DatalaneError:
    code, details = e.code(), e.details() or ""
    store = _store_error(e)
    if store is not None:  # the message names the store and the object
        return StorageError(details, transient=store == "transient")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return MismatchError(details)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return ConfigError(details)  # a bad request, or past a limit the sidecar names
    if code == grpc.StatusCode.NOT_FOUND:
        return StorageError(details, transient=_no_session(e))
    return StorageError(f"sidecar call failed: {code.name}: {details}",
                        transient=_retryable(e))



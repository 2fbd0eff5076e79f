"""The trainer's client of the pod's sidecar (DESIGN section 6).

``SidecarLoader`` opens a session for its rank over the Unix socket, streams microbatches as
numpy arrays (from the shared-memory ring or inline bytes) and tracks its position. If the
sidecar goes away (restart, ``kill -9``), it waits for the socket to serve again and re-opens
the session at its exact position from the checkpoint it carries, so no sequence is lost or
repeated. Needs only ``grpcio`` and ``numpy``.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Iterator
from itertools import chain
from typing import Any

import grpc
import numpy as np

from datalane.client.batch import Batch
from datalane.client.position import Position
from datalane.spec.errors import ConfigError, DatalaneError, MismatchError, StorageError
from datalane.wire import PROTOCOL_VERSION
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from datalane.wire.shm import ShmReader

__all__ = ["SidecarLoader"]

_RECONNECT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN}
_OPTIONS = [("grpc.max_send_message_length", 256 << 20),
            ("grpc.max_receive_message_length", 256 << 20),
            # a restarting sidecar is back within a second: retry the socket every 50-250 ms
            # instead of gRPC's default backoff of 1 s growing to 2 min
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 250)]


def _env_int(name: str, value: int | None) -> int:
    if value is not None:
        return value
    raw = os.environ.get(name)
    if raw is None:
        raise ConfigError(f"{name.lower()} not given and ${name} is not set")
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"${name} is {raw!r}, not an integer") from None


class SidecarLoader:
    """Microbatches of one rank, served by the sidecar on ``socket``."""

    def __init__(self, socket: str | None = None, *, rank: int | None = None,
                 world_size: int | None = None, microbatch_size: int = 1,
                 transport: str = "shm", copy: bool = True, resume_step: int | None = None,
                 reconnect_timeout: float = 120.0, open_timeout: float = 60.0) -> None:
        self.socket = socket or os.environ.get("DATALANE_SOCKET", "")
        if not self.socket:
            raise ConfigError("no sidecar socket: pass socket= or set $DATALANE_SOCKET")
        if transport not in ("shm", "inline"):
            raise ConfigError(f"transport {transport!r} is not 'shm' or 'inline'")
        self.rank = _env_int("RANK", rank)
        self.world_size = _env_int("WORLD_SIZE", world_size)
        if self.world_size < 1:
            raise ConfigError(f"world size must be a positive integer, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside 0..{self.world_size - 1} for world "
                              f"size {self.world_size}")
        if microbatch_size < 1:
            raise ConfigError(f"microbatch size must be a positive integer, got "
                              f"{microbatch_size}")
        self.microbatch_size = microbatch_size
        self.transport = transport
        self.copy = copy
        self.reconnect_timeout = reconnect_timeout
        self.open_timeout = open_timeout
        self.position = Position(world_size=self.world_size, microbatch_size=microbatch_size)
        self._resume_step = resume_step
        self._channel: grpc.Channel | None = None
        self._stub: pbg.DataLaneStub | None = None
        self._session = ""
        self.per_step = 0
        self.reconnects = 0

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
                             transport=pb.TRANSPORT_SHM if self.transport == "shm"
                             else pb.TRANSPORT_INLINE)
        if pos.state_json is not None:
            req.state_json = pos.state_json
        elif self._resume_step is not None:
            req.from_step = self._resume_step
        else:
            req.from_start = True
        try:
            reply: pb.OpenReply = self._stub.Open(req, timeout=self.open_timeout)
        except grpc.RpcError as e:
            raise _error(e) from None
        self._session = reply.session_id
        self.per_step = reply.microbatches_per_step
        if pos.state_json is None and self._resume_step is not None:
            pos.step = int(reply.step)
        pos.fingerprint = reply.fingerprint
        return reply

    # -- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        deadline = time.monotonic() + self.open_timeout
        while True:
            self._connect(deadline)
            try:
                reply = self._open()
                # the stream is endless; if it finishes without an error anyway (a sidecar
                # of an older version that stops serving), re-open at the position rather
                # than end the trainer's data as if it had run out
                yield from self._stream(reply)
            except grpc.RpcError as e:
                if e.code() not in _RECONNECT:
                    raise _error(e) from None
            except StorageError as e:
                if not e.transient:
                    raise
            self.reconnects += 1
            deadline = time.monotonic() + self.reconnect_timeout

    def _stream(self, reply: pb.OpenReply) -> Iterator[Batch]:
        assert self._stub is not None
        acks: queue.Queue[pb.Ack | None] = queue.Queue()
        acks.put(pb.Ack(session_id=reply.session_id))

        def requests() -> Iterator[pb.Ack]:
            while (ack := acks.get()) is not None:
                yield ack

        reader = ShmReader(reply.shm_path, reply.shm_bytes) if reply.shm_path else None
        cols = reply.seq_tokens
        # Released slots go back in batches: one Ack per quarter of the ring instead of one per
        # microbatch (each Ack is a message on the request stream and a wakeup on both sides).
        # The client owns at most `per_ack` slots (pending + the one held with copy=False), fewer
        # than the ring's, so the sidecar always has a free slot for the next microbatch. The
        # ring's slot count is learnt from the first message naming a slot past 0.
        per_ack, learn = 1, True
        pending: list[int] = []
        calls = self._stub.Stream(requests())
        held: int | None = None
        try:
            for msg in chain.from_iterable(d.items for d in calls):  # deliveries hold several
                rows = msg.sequences
                if reader is not None:
                    if learn and msg.slot:
                        per_ack = max(1, reply.shm_bytes // (msg.offset // msg.slot) // 4)
                        learn = False
                    ids, pos = reader.arrays(msg.offset, rows, cols)
                    if self.copy:
                        ids, pos = ids.copy(), pos.copy()
                        pending.append(msg.slot)
                    else:
                        if held is not None:
                            pending.append(held)
                        held = msg.slot
                    if len(pending) >= per_ack:
                        acks.put(self._ack(pending, msg))
                        pending = []
                else:
                    ids = np.frombuffer(msg.input_ids, dtype="<i4").reshape(rows, cols)
                    pos = np.frombuffer(msg.positions, dtype="<i4").reshape(rows, cols)
                    if self.copy:
                        ids, pos = ids.copy(), pos.copy()
                if msg.index + 1 == self.per_step:  # the position, at least once per step
                    acks.put(self._ack(pending, msg))
                    pending = []
                batch = Batch(int(msg.step), msg.index, ids, pos, msg.ended,
                              dict(msg.lane_digests))
                self.position.advance(int(msg.step), msg.index, self.per_step,
                                      msg.state_json or None)
                yield batch
        finally:
            acks.put(None)
            calls.cancel()
            if reader is not None:
                reader.close()

    def _ack(self, release: list[int], msg: pb.Microbatch) -> pb.Ack:
        """An Ack releasing ``release`` and reporting the position once ``msg`` is handed out
        (so it never claims more than the trainer can have received)."""
        step, consumed = int(msg.step), msg.index + 1
        if consumed >= self.per_step:
            step, consumed = step + 1, 0
        return pb.Ack(release=release, has_position=True, step=step, consumed=consumed)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position plus this rank's lane states: enough to resume anywhere, even without
        storage. Compatible with ``torch.distributed.checkpoint`` (plain JSON types)."""
        return self.position.to_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pos = Position.from_state(state)
        pos.check_layout(self.world_size, self.microbatch_size)
        pos.world_size, pos.microbatch_size = self.world_size, self.microbatch_size
        self.position = pos

    def checkpoint(self, step: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
        """Ask the sidecar to persist this rank's lanes at a step boundary (default: the
        current position, which must be a boundary) to its checkpoint store."""
        if step is None:
            if self.position.consumed:
                raise ConfigError(f"the trainer is inside step {self.position.step} "
                                  f"({self.position.consumed} microbatches in); checkpoint at "
                                  f"a step boundary")
            step = self.position.step
        if self._stub is None:
            raise ConfigError("not connected: iterate the loader first")
        try:
            reply = self._checkpoint(step, timeout)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise _error(e) from None
            # the session is gone: the sidecar restarted since the last microbatch. Open a
            # session at the position (the stream re-opens on the next microbatch) and ask
            # once more.
            self._connect(time.monotonic() + self.reconnect_timeout)
            self._open()
            try:
                reply = self._checkpoint(step, timeout)
            except grpc.RpcError as e2:
                raise _error(e2) from None
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
        if self._stub is not None and self._session:
            try:
                self._stub.Close(pb.CloseRequest(session_id=self._session), timeout=5)
            except grpc.RpcError:
                pass
        self._disconnect()

    def __enter__(self) -> SidecarLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error(e: grpc.RpcError) -> DatalaneError:
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return MismatchError(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ConfigError(details)
    if code == grpc.StatusCode.NOT_FOUND:
        return StorageError(details)
    return StorageError(f"sidecar call failed: {code.name}: {details}",
                        transient=code in _RECONNECT)



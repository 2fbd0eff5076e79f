"""Pod-level checkpoints: one object per pod per step, committed through the store.

Every rank of the pod asks for a checkpoint of the same step boundary; when the sessions the
pod serves have all asked (``ranks_per_pod`` of them, or every open session), their lane
states go to the store as one pod object, with the lanes' window digests since the previous
checkpoint (the ledger), and the store commits the step if every pod has written its object.
Without a store, a checkpoint only returns the lane states (the client keeps them inline).

The store's part is bounded: the object is written and the step committed on a thread of
their own, and the ranks' requests wait for them at most :data:`STORE_SECONDS` (30 s) from
when the last rank asked. A store that does not answer by then - down, unreachable, throttling
without end - fails the checkpoint with a ``StorageError`` naming the store and the object
(``Saved.from_store``: the client raises it to the trainer instead of asking again); the
write may still complete later, and a checkpoint asked again finds the step committed. The
store's other calls here (whether a step is committed, the confirmation of one that is) run on
the service's :class:`~datalane.store.calls.StoreCalls`, bounded by the same limit.

A step the store already committed (a previous sidecar process wrote it before it stopped,
and the rank asking was not told) is confirmed for a rank alone: its lane states must equal
the committed ones. It does not wait for the pod's other ranks, which went on past it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import DatalaneError, StorageError
from datalane.spec.state import Checkpoint
from datalane.store.calls import StoreCalls

__all__ = ["STORE_SECONDS", "PodCheckpoints", "Saved"]

STORE_SECONDS = 30.0  # the most a checkpoint waits for the store once every rank asked


@dataclass
class Saved:
    step: int
    object: str = ""
    committed: bool = False
    error: BaseException | None = None
    from_store: bool = False  # the error is the store's (not a wait the sidecar ended)


@dataclass
class _Pending:
    states: dict[str, Checkpoint] = field(default_factory=dict)  # session -> its lanes
    digests: dict[int, dict[int, bytes]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    result: Saved | None = None
    written: int = 0  # sessions in the pod object written so far
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    asked: threading.Event = field(default_factory=threading.Event)  # every rank asked
    writing_since: float | None = None  # monotonic start of the write in flight
    committed_before: bool | None = None  # found committed in the store by an earlier process


class PodCheckpoints:
    """Gathers the pod's sessions for a step, then writes one object and tries to commit."""

    def __init__(self, store: Any | None, pod: str, ranks_per_pod: int,
                 store_seconds: float = STORE_SECONDS,
                 calls: StoreCalls | None = None) -> None:
        self.store = store
        self.pod = pod
        self.ranks_per_pod = ranks_per_pod
        self.store_seconds = store_seconds
        self.calls = calls or StoreCalls(getattr(store, "uri", ""), store_seconds)
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self.last_step: int | None = None

    def save(self, step: int, session_id: str, state_json: str,
             digests: dict[int, dict[int, bytes]], timeout: float = 120.0) -> Saved:
        """Record one session's states for ``step``; blocks until the pod object is written
        (``timeout`` for the pod's other ranks to ask, then ``store_seconds`` for the store)."""
        if self.store is None:
            return Saved(step)
        state = Checkpoint.from_json(json.loads(state_json))
        with self._lock:
            pending = self._pending.setdefault(step, _Pending())
            first = not pending.states
            pending.states[session_id] = state
            for s, row in digests.items():  # merge: each session holds its own lanes
                pending.digests.setdefault(s, {}).update(row)
            count = len(pending.states)
        # the pod object is written once every rank of the pod asked; a rank beyond
        # ranks_per_pod (a misconfigured pod) rewrites it with the union, never loses lanes
        if count >= self.ranks_per_pod:
            with self._lock:
                if pending.done.is_set() and count > pending.written:
                    # asked again after a failed write (or by one more rank): this request
                    # waits for the write it starts, not for the last one's result
                    pending.done.clear()
                    pending.result = pending.writing_since = None
            pending.asked.set()
            # not a daemon: a sidecar that stops finishes the write in flight before it exits
            threading.Thread(target=self._write_union, args=(step, pending, count),
                             name=f"checkpoint-{step}").start()
        elif self._committed_before(step, pending, first):
            return self._confirm(step, state)
        if not pending.asked.wait(timeout):
            return Saved(step, error=TimeoutError(
                f"step {step}: {len(pending.states)} of {self.ranks_per_pod} ranks of pod "
                f"{self.pod} asked for a checkpoint within {timeout:.0f} s"))
        started = pending.writing_since or time.monotonic()
        if not pending.done.wait(max(0.0, started + self.store_seconds - time.monotonic())):
            return Saved(step, error=StorageError(
                f"the checkpoint store {self.store.uri} did not answer within "
                f"{self.store_seconds:g} s while pod {self.pod}'s object of step {step} "
                f"({self.store.pod_uri(step, self.pod)}) was written and committed; the store "
                f"may be down or unreachable", transient=True), from_store=True)
        assert pending.result is not None  # set before done
        return pending.result

    def _named(self, step: int, error: BaseException) -> BaseException:
        """A store error that also names the pod's object of the step and the store."""
        if not isinstance(error, StorageError) or self.store is None:
            return error
        named = StorageError(f"pod {self.pod}'s object {self.store.pod_uri(step, self.pod)} "
                             f"in the checkpoint store {self.store.uri}: {error}",
                             transient=error.transient)
        named.__cause__ = error
        return named

    def _write_union(self, step: int, pending: _Pending, count: int) -> None:
        with pending.write_lock:
            if count > pending.written:
                self._write(step, pending)

    def _committed_before(self, step: int, pending: _Pending, first: bool) -> bool:
        """Whether the store committed ``step`` before this pod's ranks asked here: asked
        by a step's first rank until this process has written a step itself (every later
        step is new); a store that cannot tell counts as no."""
        if first and self.store is not None and self.last_step is None:
            try:
                store = self.store
                pending.committed_before = bool(self.calls(
                    f"whether step {step} is committed", lambda: store.is_committed(step)))
            except DatalaneError:
                pending.committed_before = False
        return bool(pending.committed_before)

    def _confirm(self, step: int, state: Checkpoint) -> Saved:
        """One rank's states of a step committed already: checked against the committed
        ones (write_pod writes nothing then), and the commit confirmed."""
        store = self.store
        assert store is not None

        def confirm() -> tuple[Any, Any]:
            obj = store.write_pod(step, self.pod, state.lanes, {}, state.fingerprint,
                                  state.fingerprint_doc, state.lanes_total)
            return obj, store.commit(step)

        try:
            obj, manifest = self.calls(f"confirm the committed step {step}", confirm)
        except BaseException as e:
            return Saved(step, error=self._named(step, e), from_store=isinstance(e, StorageError))
        return Saved(step, str(obj), manifest is not None)

    def abort(self, reason: str) -> None:
        """End every wait for the pod's other ranks (the sidecar is stopping): each waiting
        request gets a transient error, so its client asks the restarted sidecar again. A
        wait left blocked would keep the process from exiting on SIGTERM."""
        with self._lock:
            waiting = [(step, p) for step, p in self._pending.items() if not p.done.is_set()]
        for step, pending in waiting:
            if pending.result is None:
                pending.result = Saved(step, error=StorageError(
                    f"step {step}: {reason}; ask again", transient=True))
            pending.done.set()
            pending.asked.set()  # after done: a rank waiting for the others takes the result

    def _write(self, step: int, pending: _Pending) -> None:
        store = self.store
        assert store is not None  # save() returns early without a store
        pending.writing_since = time.monotonic()
        try:
            with self._lock:
                states = list(pending.states.values())
                digests = {s: dict(row) for s, row in pending.digests.items()}
            lanes = {}
            for ckpt in states:
                lanes.update(ckpt.lanes)
            head = states[0]
            obj = store.write_pod(step, self.pod, lanes, digests, head.fingerprint,
                                  head.fingerprint_doc, head.lanes_total)
            pending.written = len(states)
            manifest = store.commit(step)
            pending.result = Saved(step, str(obj), manifest is not None)
            self.last_step = step
        except BaseException as e:  # reported to every waiting rank
            pending.result = Saved(step, error=self._named(step, e),
                                   from_store=isinstance(e, StorageError))
            pending.written = 0  # a rank that asks again writes and commits again
        finally:
            pending.done.set()
            with self._lock:
                for s in [s for s in self._pending if s < step]:
                    del self._pending[s]

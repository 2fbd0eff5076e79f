"""Pod-level checkpoints: one object per pod per step, committed through the store.

Every rank of the pod asks for a checkpoint of the same step boundary; when the sessions the
pod serves have all asked (``ranks_per_pod`` of them, or every open session), their lane
states go to the store as one pod object, with the lanes' window digests since the previous
checkpoint (the ledger), and the store commits the step if every pod has written its object.
Without a store, a checkpoint only returns the lane states (the client keeps them inline).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import StorageError
from datalane.spec.state import Checkpoint

__all__ = ["PodCheckpoints", "Saved"]


@dataclass
class Saved:
    step: int
    object: str = ""
    committed: bool = False
    error: BaseException | None = None


@dataclass
class _Pending:
    states: dict[str, Checkpoint] = field(default_factory=dict)  # session -> its lanes
    digests: dict[int, dict[int, bytes]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    result: Saved | None = None
    written: int = 0  # sessions in the pod object written so far
    write_lock: threading.Lock = field(default_factory=threading.Lock)


class PodCheckpoints:
    """Gathers the pod's sessions for a step, then writes one object and tries to commit."""

    def __init__(self, store: Any | None, pod: str, ranks_per_pod: int) -> None:
        self.store = store
        self.pod = pod
        self.ranks_per_pod = ranks_per_pod
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self.last_step: int | None = None

    def save(self, step: int, session_id: str, state_json: str,
             digests: dict[int, dict[int, bytes]], timeout: float = 120.0) -> Saved:
        """Record one session's states for ``step``; blocks until the pod object is written."""
        if self.store is None:
            return Saved(step)
        with self._lock:
            pending = self._pending.setdefault(step, _Pending())
            pending.states[session_id] = Checkpoint.from_json(json.loads(state_json))
            for s, row in digests.items():  # merge: each session holds its own lanes
                pending.digests.setdefault(s, {}).update(row)
            count = len(pending.states)
        # the pod object is written once every rank of the pod asked; a rank beyond
        # ranks_per_pod (a misconfigured pod) rewrites it with the union, never loses lanes
        if count >= self.ranks_per_pod:
            with pending.write_lock:
                if count > pending.written:
                    self._write(step, pending)
        if not pending.done.wait(timeout):
            return Saved(step, error=TimeoutError(
                f"step {step}: {len(pending.states)} of {self.ranks_per_pod} ranks of pod "
                f"{self.pod} asked for a checkpoint within {timeout:.0f} s"))
        assert pending.result is not None  # set before done
        return pending.result

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

    def _write(self, step: int, pending: _Pending) -> None:
        store = self.store
        assert store is not None  # save() returns early without a store
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
            pending.result = Saved(step, error=e)
            pending.written = 0  # a rank that asks again writes and commits again
        finally:
            pending.done.set()
            with self._lock:
                for s in [s for s in self._pending if s < step]:
                    del self._pending[s]

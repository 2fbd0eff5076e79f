"""Shared builders for the checkpoint-store tests: lane states, digests, whole steps."""

from __future__ import annotations

import hashlib
from typing import Any

from datalane.spec.state import Counters, LaneState, PackerState, Piece, SourceCursor
from datalane.store import CheckpointStore

LANES = 8
FINGERPRINT = "f" * 64
FP_DOC: dict[str, Any] = {"recipe": {"seed": 5, "lanes": LANES}, "files": {}}


def lane_state(lane: int, step: int, seqs_per_step: int = 2) -> LaneState:
    """A plausible resume point of ``lane`` at ``step`` (distinct for every lane and step)."""
    return LaneState(
        lane=lane,
        sequences=step * seqs_per_step,
        sources=(SourceCursor(0, step // 4, lane, 100 * step, step % 4),
                 SourceCursor(1, 0, lane, -1, step)),
        mixture=(1000 * step + lane, 400 * step),
        packer=PackerState("wrap", {"held": [Piece(0, (lane % 2, 7 * step), 3, 90).encode()]}),
        ended=False,
        counters=Counters(docs=10 * step, kept=9 * step, tokens=300 * step, padding=0,
                          skipped={"empty_text": step % 3}),
    )


def digest(step: int, lane: int) -> bytes:
    """A stand-in for the window digest of ``lane`` at ``step``."""
    return hashlib.sha256(f"window {step} {lane}".encode()).digest()


def global_of(step: int, lanes: int = LANES) -> str:
    """What the ledger must record for ``step``: global_hash of the lane digests."""
    from datalane.spec.hashing import global_hash
    return global_hash(digest(step, lane) for lane in range(lanes))


def pod_lanes(pod: int, pods: int, lanes: int = LANES) -> range:
    per = lanes // pods
    return range(pod * per, (pod + 1) * per)


def write_pod(store: CheckpointStore, step: int, pod: int, pods: int, since: int | None,
              lanes: int = LANES, fingerprint: str = FINGERPRINT) -> str:
    """Write pod ``pod`` of ``pods`` at ``step`` with digests for steps ``[since, step)``."""
    own = pod_lanes(pod, pods, lanes)
    start = 0 if since is None else since
    digests = {s: {lane: digest(s, lane) for lane in own} for s in range(start, step)}
    return store.write_pod(step, pod, {lane: lane_state(lane, step) for lane in own}, digests,
                           fingerprint, FP_DOC, lanes)


def write_step(store: CheckpointStore, step: int, pods: int = 2, since: int | None = None,
               skip: tuple[int, ...] = (), lanes: int = LANES) -> None:
    """Write every pod object of ``step`` except the pods in ``skip``."""
    for pod in range(pods):
        if pod not in skip:
            write_pod(store, step, pod, pods, since, lanes)


def commit_steps(store: CheckpointStore, steps: list[int], pods: int = 2) -> None:
    """Write and commit ``steps`` in order, each with the ledger since the previous."""
    prev: int | None = None
    for step in steps:
        write_step(store, step, pods, since=prev)
        assert store.commit(step) is not None
        prev = step

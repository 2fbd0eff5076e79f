"""Persisted state schemas: lane resume points and checkpoints (DESIGN section 4).

A :class:`LaneState` is the compact state of one lane between two steps. It holds references,
never tokens: per-source cursors, the mixture's token counters, the packer's carry-over as
``(source, file, position, token range)`` pieces, and counters. Its JSON form is versioned
and small (a few hundred bytes for ``wrap``).

A :class:`Checkpoint` bundles the lane states of one step with the recipe fingerprint and the
fingerprint document, so a restore with another recipe can say which fields differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import ConfigError, MismatchError

__all__ = [
    "CHECKPOINT_FORMAT",
    "LANE_STATE_VERSION",
    "Checkpoint",
    "Counters",
    "LaneState",
    "Piece",
    "SourceCursor",
    "merge_checkpoints",
]

LANE_STATE_VERSION = 1
CHECKPOINT_FORMAT = "datalane.checkpoint/v1"


@dataclass(frozen=True)
class SourceCursor:
    """Where a lane stands in one source: block ``block`` of ``epoch`` starts at record
    position ``pos`` of the lane's chunk ordinal ``chunk`` (-1: the chunk's start); ``offset``
    shuffled records of that block are consumed."""

    epoch: int
    block: int
    chunk: int
    pos: int
    offset: int

    def encode(self) -> list[int]:
        return [self.epoch, self.block, self.chunk, self.pos, self.offset]

    @classmethod
    def decode(cls, data: Any, where: str) -> SourceCursor:
        ints = _ints(data, 5, where)
        return cls(*ints)


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of the document at ``pos`` in file ``file`` of ``source``."""

    source: int
    file: int
    pos: int
    start: int
    stop: int

    def encode(self) -> list[int]:
        return [self.source, self.file, self.pos, self.start, self.stop]

    @classmethod
    def decode(cls, data: Any, where: str) -> Piece:
        return cls(*_ints(data, 5, where))


@dataclass
class Counters:
    """What a lane has read and emitted so far; restored with the lane, so totals are exact."""

    docs: int = 0  # records consumed (kept or not)
    kept: int = 0  # documents packed
    tokens: int = 0  # document tokens emitted (BOS/EOS included, padding excluded)
    padding: int = 0  # padding tokens emitted
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(self, other: Counters) -> None:
        self.docs += other.docs
        self.kept += other.kept
        self.tokens += other.tokens
        self.padding += other.padding
        for k, v in other.skipped.items():
            self.skipped[k] = self.skipped.get(k, 0) + v

    def encode(self) -> list[Any]:
        return [self.docs, self.kept, self.tokens, self.padding, dict(sorted(self.skipped.items()))]

    @classmethod
    def decode(cls, data: Any, where: str) -> Counters:
        if not isinstance(data, list) or len(data) != 5 or not isinstance(data[4], dict):
            raise MismatchError(f"{where} must be [docs, kept, tokens, padding, {{reason: n}}]")
        docs, kept, tokens, padding = _ints(data[:4], 4, where)
        skipped = {str(k): _int(v, f"{where} skipped {k!r}") for k, v in data[4].items()}
        return cls(docs, kept, tokens, padding, skipped)


@dataclass(frozen=True)
class LaneState:
    """Resume point of one lane after ``sequences`` sequences (a whole number of steps)."""

    lane: int
    sequences: int
    sources: tuple[SourceCursor, ...]
    mixture: tuple[int, ...]
    carry: tuple[tuple[Piece, ...], ...]  # wrap: one group; bestfit: one per open sequence
    pending: Piece | None  # bestfit: the rest of a document not placed yet
    ended: bool  # every source is exhausted and the packer flushed
    counters: Counters

    @classmethod
    def initial(cls, lane: int, sources: int) -> LaneState:
        """The state of a lane before its first step."""
        return cls(lane, 0, tuple(SourceCursor(0, 0, 0, -1, 0) for _ in range(sources)),
                   (0,) * sources, (), None, False, Counters())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": LANE_STATE_VERSION,
            "lane": self.lane,
            "seqs": self.sequences,
            "src": [c.encode() for c in self.sources],
            "mix": list(self.mixture),
            "carry": [[p.encode() for p in group] for group in self.carry],
            "n": self.counters.encode(),
        }
        if self.pending is not None:
            out["pend"] = self.pending.encode()
        if self.ended:
            out["end"] = 1
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "lane state") -> LaneState:
        if not isinstance(data, dict):
            raise MismatchError(f"{where} must be a JSON object, got {type(data).__name__}")
        version = data.get("v")
        if version != LANE_STATE_VERSION:
            raise MismatchError(f"{where} has schema version {version!r}; this datalane reads "
                                f"version {LANE_STATE_VERSION}")
        known = {"v", "lane", "seqs", "src", "mix", "carry", "n", "pend", "end"}
        extra = sorted(set(data) - known)
        if extra:
            raise MismatchError(f"{where} has unknown keys {extra}")
        try:
            return cls(
                lane=_int(data["lane"], f"{where}.lane"),
                sequences=_int(data["seqs"], f"{where}.seqs"),
                sources=tuple(SourceCursor.decode(c, f"{where}.src[{i}]")
                              for i, c in enumerate(data["src"])),
                mixture=tuple(_int(m, f"{where}.mix") for m in data["mix"]),
                carry=tuple(tuple(Piece.decode(p, f"{where}.carry") for p in g)
                            for g in data["carry"]),
                pending=Piece.decode(data["pend"], f"{where}.pend") if "pend" in data else None,
                ended=bool(data.get("end", 0)),
                counters=Counters.decode(data["n"], f"{where}.n"),
            )
        except KeyError as e:
            raise MismatchError(f"{where} lacks the key {e.args[0]!r}") from e
        except TypeError as e:
            raise MismatchError(f"{where} is malformed: {e}") from e

    def encoded_size(self) -> int:
        """Bytes of the compact JSON form (the figure the 1 KiB target is about)."""
        return len(json.dumps(self.to_json(), separators=(",", ":")))


@dataclass
class Checkpoint:
    """Lane states of one step plus the fingerprint they belong to."""

    step: int
    fingerprint: str
    fingerprint_doc: dict[str, Any] | None
    lanes: dict[int, LaneState]
    lanes_total: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "fingerprint": self.fingerprint,
            "lanes_total": self.lanes_total,
            "lanes": {str(k): v.to_json() for k, v in sorted(self.lanes.items())},
            "fingerprint_doc": self.fingerprint_doc,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any, where: str = "checkpoint") -> Checkpoint:
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise MismatchError(f"{where} is not a datalane checkpoint (format {got!r}, "
                                f"expected {CHECKPOINT_FORMAT!r})")
        try:
            lanes = {int(k): LaneState.from_json(v, f"{where} lane {k}")
                     for k, v in data["lanes"].items()}
            ckpt = cls(_int(data["step"], f"{where}.step"), str(data["fingerprint"]),
                       data.get("fingerprint_doc"), lanes,
                       _int(data["lanes_total"], f"{where}.lanes_total"))
        except KeyError as e:
            raise MismatchError(f"{where} lacks the key {e.args[0]!r}") from e
        except ValueError as e:  # a lane key that is not a number
            raise MismatchError(f"{where} has a lane key that is not a lane number: {e}") from e
        for k, lane in lanes.items():
            if lane.lane != k:
                raise MismatchError(f"{where}: lane {k} holds the state of lane {lane.lane}")
        return ckpt

    @classmethod
    def load(cls, path: str) -> Checkpoint:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read state file {path}: {e.strerror or e}") from e
        except json.JSONDecodeError as e:
            raise MismatchError(f"state file {path} is not valid JSON: {e}") from e
        return cls.from_json(data, f"state file {path}")


def merge_checkpoints(parts: Iterable[Checkpoint]) -> Checkpoint:
    """Union of the per-rank checkpoints of one step (they must agree on step and recipe)."""
    parts = list(parts)
    if not parts:
        raise ConfigError("no checkpoint to merge")
    head = parts[0]
    lanes: dict[int, LaneState] = {}
    for p in parts:
        if (p.step, p.fingerprint, p.lanes_total) != (head.step, head.fingerprint,
                                                      head.lanes_total):
            raise MismatchError(
                f"cannot merge a checkpoint of step {p.step} (fingerprint {p.fingerprint[:12]}, "
                f"{p.lanes_total} lanes) with one of step {head.step} (fingerprint "
                f"{head.fingerprint[:12]}, {head.lanes_total} lanes)")
        lanes.update(p.lanes)
    return Checkpoint(head.step, head.fingerprint, head.fingerprint_doc, lanes, head.lanes_total)


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MismatchError(f"{where} must be an integer, got {v!r}")
    return v


def _ints(data: Any, n: int, where: str) -> list[int]:
    if not isinstance(data, list) or len(data) != n:
        raise MismatchError(f"{where} must be a list of {n} integers, got {data!r}")
    return [_int(v, where) for v in data]

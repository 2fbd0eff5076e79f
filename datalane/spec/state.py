"""Persisted state schemas: lane resume points and checkpoints (docs/checkpoint-format.md).

A :class:`LaneState` is the compact state of one lane between two steps. It holds references,
never tokens: per-source cursors, the mixture's token counters, the packer's own state (its
carry-over as :class:`Piece` s: a token range of a document named by the reference its
format defines) nested under the packer's name, and counters. Its JSON form is versioned and
small (a few hundred bytes for ``wrap``). A lane of a recipe with phases also holds its
mixture's re-basing values (:class:`MixtureBase`, under ``mixb``); a lane of a recipe without
phases never does, so its JSON is what it always was. Version 1 (datalane 0.1 and 0.2: the
carry-over as ``carry``/``pend`` lists of ``[source, file, position, start, stop]``) still
loads.

A :class:`Checkpoint` bundles the lane states of one step with the recipe fingerprint and the
fingerprint document, so a restore with another recipe can say which fields differ. Its JSON
carries a ``sha256`` of its own content (:func:`checkpoint_sha256`) and every number is
range-checked when read, so a damaged state is refused naming the value, never used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.fingerprint import fingerprint_of
from datalane.spec.integrity import SEAL_KEY, check_seal, content_sha256, parse_json, read_bytes

__all__ = [
    "CHECKPOINT_FORMAT",
    "LANE_STATE_VERSION",
    "Checkpoint",
    "Counters",
    "LaneState",
    "MixtureBase",
    "PackerState",
    "Piece",
    "SourceCursor",
    "check_step",
    "checkpoint_sha256",
    "checkpoint_text",
    "merge_checkpoints",
]

LANE_STATE_VERSION = 2
_MAX_REF = 4  # integers in a document reference
CHECKPOINT_FORMAT = "datalane.checkpoint/v1"
MAX_STEP = 10**12  # steps are 12 digits in the store's layout
_MAX_INT = 2**63 - 1  # every count and position fits an int64
_CHECKPOINT_KEYS = frozenset({"format", "step", "fingerprint", "lanes_total", "lanes",
                              "fingerprint_doc", "sha256"})
_UNSEALED = ("fingerprint_doc",)  # bound by the fingerprint (its SHA-256) instead


def check_step(step: Any, where: str = "step") -> int:
    """``step`` if it is an integer in ``[0, 10^12)``; ConfigError naming ``where`` otherwise.

    For every step a caller names (``resume_step``, ``--save-state-at``, a store's step)."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < MAX_STEP:
        raise ConfigError(f"{where} must be an integer in [0, 10^12), got {step!r}")
    return step


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
        # pos -1 stands for the chunk's start
        return cls(*_ints(data, where, ("epoch", "block", "chunk", "pos", "offset"), {"pos": -1}))


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of the document of ``source`` that ``ref`` names (a reference
    the source's format defines; JSONL and Parquet: ``(file index, position)``)."""

    source: int
    ref: tuple[int, ...]
    start: int
    stop: int

    def encode(self) -> list[Any]:
        return [self.source, list(self.ref), self.start, self.stop]

    @classmethod
    def decode(cls, data: Any, where: str) -> Piece:
        """From ``[source, [ref...], start, stop]``."""
        if not isinstance(data, list) or len(data) != 4 or not isinstance(data[1], list):
            raise MismatchError(f"{where} must be [source, [reference...], start, stop], got "
                                f"{_short(data)}")
        if not 1 <= len(data[1]) <= _MAX_REF:
            raise MismatchError(f"{where}: a document reference has 1 to {_MAX_REF} integers, "
                                f"got {_short(data[1])}")
        ref = tuple(_int(v, f"{where} reference[{i}]") for i, v in enumerate(data[1]))
        source, start, stop = _ints([data[0], data[2], data[3]], where,
                                    ("source", "start", "stop"))
        return cls._checked(cls(source, ref, start, stop), where)

    @classmethod
    def decode_v1(cls, data: Any, where: str) -> Piece:
        """From the version-1 form ``[source, file, position, start, stop]``."""
        source, file, pos, start, stop = _ints(data, where,
                                               ("source", "file", "pos", "start", "stop"))
        return cls._checked(cls(source, (file, pos), start, stop), where)

    @staticmethod
    def _checked(piece: Piece, where: str) -> Piece:
        if piece.start >= piece.stop:
            raise MismatchError(f"{where} {piece.encode()} is an empty token range "
                                f"[{piece.start}, {piece.stop})")
        return piece

    @property
    def tokens(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class PackerState:
    """A packer's own resume state: its name and its JSON (parsed by the packer).

    ``name`` is None for a state of lane-state version 1, whose ``data`` is
    ``{"carry": [[piece, ...], ...], "pending": piece or None}`` in today's piece encoding;
    every packer knows how to read that form of its own carry-over."""

    name: str | None
    data: Mapping[str, Any]

    @classmethod
    def empty(cls) -> PackerState:
        return cls(None, {"carry": [], "pending": None})


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
        docs, kept, tokens, padding = _ints(data[:4], where, ("docs", "kept", "tokens", "padding"))
        skipped = {str(k): _int(v, f"{where} skipped {k!r}", lo=0) for k, v in data[4].items()}
        return cls(docs, kept, tokens, padding, skipped)


@dataclass(frozen=True)
class MixtureBase:
    """The mixture's re-basing values under a schedule (engine/mixture.py): per source the
    pass ``P_i`` and the consumed tokens ``a_i`` at the last weight change (the pass is
    ``P_i + (consumed_i - a_i) / w_i``). Floats are written in their shortest repr, which
    JSON reads back exactly."""

    passes: tuple[float, ...]
    anchors: tuple[int, ...]

    @classmethod
    def initial(cls, sources: int) -> MixtureBase:
        return cls((0.0,) * sources, (0,) * sources)

    def encode(self) -> list[Any]:
        return [list(self.passes), list(self.anchors)]

    @classmethod
    def decode(cls, data: Any, where: str) -> MixtureBase:
        if not isinstance(data, list) or len(data) != 2:
            raise MismatchError(f"{where} must be [[pass...], [anchor...]], got "
                                f"{_short(data)}")
        passes = tuple(_float(v, f"{where} pass[{i}]")
                       for i, v in enumerate(_list(data[0], f"{where} passes")))
        anchors = tuple(_int(v, f"{where} anchor[{i}]")
                        for i, v in enumerate(_list(data[1], f"{where} anchors")))
        if len(passes) != len(anchors):
            raise MismatchError(f"{where} has {len(passes)} passes and {len(anchors)} anchors; "
                                f"one of each per source")
        return cls(passes, anchors)

    def extended(self, sources: int) -> MixtureBase:
        """The same values for ``sources`` sources (sources added after the others start at
        pass 0, consumed 0)."""
        more = sources - len(self.passes)
        return MixtureBase((*self.passes, *(0.0,) * more), (*self.anchors, *(0,) * more))


@dataclass(frozen=True)
class LaneState:
    """Resume point of one lane after ``sequences`` sequences (a whole number of steps)."""

    lane: int
    sequences: int
    sources: tuple[SourceCursor, ...]
    mixture: tuple[int, ...]
    packer: PackerState
    ended: bool  # every source is exhausted and the packer flushed
    counters: Counters
    mixture_base: MixtureBase | None = None  # only for a recipe with phases

    @classmethod
    def initial(cls, lane: int, sources: int) -> LaneState:
        """The state of a lane before its first step."""
        return cls(lane, 0, tuple(SourceCursor(0, 0, 0, -1, 0) for _ in range(sources)),
                   (0,) * sources, PackerState.empty(), False, Counters())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": LANE_STATE_VERSION,
            "lane": self.lane,
            "seqs": self.sequences,
            "src": [c.encode() for c in self.sources],
            "mix": list(self.mixture),
            "n": self.counters.encode(),
        }
        if self.mixture_base is not None:
            out["mixb"] = self.mixture_base.encode()
        if self.packer.name is not None:
            out["pack"] = {self.packer.name: dict(self.packer.data)}
        elif self.packer.data.get("carry") or self.packer.data.get("pending"):
            # a version-1 carry-over that no packer has read yet (a restored state saved
            # again before its lane opened) is written back in its own version
            out["v"] = 1
            out["carry"] = [[_v1(p) for p in g] for g in self.packer.data["carry"]]
            if self.packer.data.get("pending") is not None:
                out["pend"] = _v1(self.packer.data["pending"])
        if self.ended:
            out["end"] = 1
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "lane state") -> LaneState:
        if not isinstance(data, dict):
            raise MismatchError(f"{where} must be a JSON object, got {type(data).__name__}")
        version = data.get("v")
        if version not in (1, LANE_STATE_VERSION) or isinstance(version, bool):
            raise MismatchError(f"{where} has schema version {version!r}; this datalane reads "
                                f"versions 1 to {LANE_STATE_VERSION}")
        known = {"v", "lane", "seqs", "src", "mix", "n", "end", "mixb"}
        known |= {"carry", "pend"} if version == 1 else {"pack"}
        extra = sorted(set(data) - known)
        if extra:
            raise MismatchError(f"{where} has unknown keys {extra}")
        try:
            sources = tuple(SourceCursor.decode(c, f"{where}.src[{i}]")
                            for i, c in enumerate(_list(data["src"], f"{where}.src")))
            mixture = tuple(_int(m, f"{where}.mix[{i}]", lo=0)
                            for i, m in enumerate(_list(data["mix"], f"{where}.mix")))
            packer = (_packer_v1(data, where) if version == 1
                      else _packer(data.get("pack"), f"{where}.pack"))
            base = (MixtureBase.decode(data["mixb"], f"{where}.mixb") if "mixb" in data
                    else None)
            if base is not None and len(base.passes) != len(mixture):
                raise MismatchError(f"{where}.mixb has {len(base.passes)} sources, .mix "
                                    f"{len(mixture)}")
            end = data.get("end", 0)
            if end not in (0, 1) or isinstance(end, float):
                raise MismatchError(f"{where}.end must be 1 when present, got {end!r}")
            return cls(
                lane=_int(data["lane"], f"{where}.lane", lo=0),
                sequences=_int(data["seqs"], f"{where}.seqs", lo=0),
                sources=sources,
                mixture=mixture,
                packer=packer,
                ended=bool(end),
                counters=Counters.decode(data["n"], f"{where}.n"),
                mixture_base=base,
            )
        except KeyError as e:
            raise MismatchError(f"{where} lacks the key {e.args[0]!r}") from e

    def encoded_size(self) -> int:
        """Bytes of the compact JSON form (the figure the 1 KiB target is about)."""
        return len(json.dumps(self.to_json(), separators=(",", ":")))


def _packer(data: Any, where: str) -> PackerState:
    if data is None:
        return PackerState.empty()
    if not isinstance(data, dict) or len(data) != 1:
        raise MismatchError(f"{where} must be an object of one key, the packer's name, got "
                            f"{_short(data)}")
    (name, state), = data.items()
    if not isinstance(state, dict):
        raise MismatchError(f"{where}.{name} must be an object, got {_short(state)}")
    if not name:
        raise MismatchError(f"{where} names no packer")
    return PackerState(str(name), state)


def _packer_v1(data: dict[str, Any], where: str) -> PackerState:
    return PackerState(None, _v1_carry(data["carry"], data.get("pend"), where, Piece.decode_v1))


def _v1(piece: list[Any]) -> list[int]:
    source, (file, pos), start, stop = piece
    return [source, file, pos, start, stop]


def _v1_carry(carry: Any, pending: Any, where: str, decode: Any) -> dict[str, Any]:
    """A version-1 carry-over in today's piece encoding (validated piece by piece)."""
    groups = [[decode(p, f"{where}.carry[{g}][{i}]").encode()
               for i, p in enumerate(_list(group, f"{where}.carry[{g}]"))]
              for g, group in enumerate(_list(carry, f"{where}.carry"))]
    pend = decode(pending, f"{where}.pend").encode() if pending is not None else None
    return {"carry": groups, "pending": pend}


@dataclass
class Checkpoint:
    """Lane states of one step plus the fingerprint they belong to."""

    step: int
    fingerprint: str
    fingerprint_doc: dict[str, Any] | None
    lanes: dict[int, LaneState]
    lanes_total: int

    def to_json(self) -> dict[str, Any]:
        """The JSON form, sealed: ``sha256`` (the last key) is :func:`checkpoint_sha256`."""
        out: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "fingerprint": self.fingerprint,
            "lanes_total": self.lanes_total,
            "lanes": {str(k): v.to_json() for k, v in sorted(self.lanes.items())},
            "fingerprint_doc": self.fingerprint_doc,
        }
        out["sha256"] = checkpoint_sha256(out)
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any, where: str = "checkpoint", *,
                  allow_unsealed: bool = False) -> Checkpoint:
        """Parse and verify a checkpoint's JSON; MismatchError naming ``where`` and the value.

        A ``sha256`` that does not match the content is refused, and so is a checkpoint
        without one unless ``allow_unsealed`` (datalane 0.1 wrote none: such a state is then
        checked field by field only, so a flipped digit goes unnoticed). The fingerprint
        document must hash to the fingerprint, and every number must lie in its range.
        """
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise MismatchError(f"{where} is not a datalane checkpoint (format {got!r}, "
                                f"expected {CHECKPOINT_FORMAT!r})")
        extra = sorted(set(data) - _CHECKPOINT_KEYS)
        if extra:
            raise MismatchError(f"{where} has unknown keys {extra}")
        missing = sorted({"step", "fingerprint", "lanes_total", "lanes"} - set(data))
        if missing:
            raise MismatchError(f"{where} lacks the key {missing[0]!r}")
        if SEAL_KEY not in data and not allow_unsealed:
            raise MismatchError(
                f"{where} carries no sha256 of its content, so damage to it cannot be "
                f"detected; datalane has sealed every state it wrote since 0.2. A state of "
                f"datalane 0.1 loads only when allowed explicitly (allow_unsealed=True, "
                f"`datalane run --allow-unsealed-state`)")
        check_seal(data, where, _UNSEALED)
        step = _int(data["step"], f"{where}: step", lo=0, hi=MAX_STEP - 1)
        lanes_total = _int(data["lanes_total"], f"{where}: lanes_total", lo=1)
        fingerprint = data["fingerprint"]
        if not isinstance(fingerprint, str) or not fingerprint:
            raise MismatchError(f"{where}: fingerprint must be a non-empty string, got "
                                f"{fingerprint!r}")
        doc = data.get("fingerprint_doc")
        if doc is not None:
            if not isinstance(doc, dict):
                raise MismatchError(f"{where}: fingerprint_doc must be an object or null, got "
                                    f"{type(doc).__name__}")
            if fingerprint_of(doc) != fingerprint:
                raise MismatchError(f"{where}: its fingerprint document does not hash to its "
                                    f"fingerprint {fingerprint[:16]}...; it was altered or "
                                    f"damaged and will not be used")
        raw = data["lanes"]
        if not isinstance(raw, dict):
            raise MismatchError(f"{where}: lanes must be an object of lane number -> lane "
                                f"state, got {type(raw).__name__} {_short(raw)}")
        lanes: dict[int, LaneState] = {}
        for key, value in raw.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit()
                    and str(int(key)) == key):
                raise MismatchError(f"{where} has the lane key {key!r}, which is not a lane "
                                    f"number")
            lane = int(key)
            if lane >= lanes_total:
                raise MismatchError(f"{where} holds lane {lane}, outside 0..{lanes_total - 1} "
                                    f"of its {lanes_total} lanes")
            state = LaneState.from_json(value, f"{where} lane {key}")
            if state.lane != lane:
                raise MismatchError(f"{where}: lane {lane} holds the state of lane "
                                    f"{state.lane}")
            lanes[lane] = state
        return cls(step, fingerprint, doc, lanes, lanes_total)

    @classmethod
    def load(cls, path: str, *, allow_unsealed: bool = False) -> Checkpoint:
        """Read and verify a state file (``datalane run --state-out``); ``allow_unsealed`` as
        in :meth:`from_json`."""
        data = parse_json(read_bytes(path, "state file"), f"state file {path}", MismatchError)
        return cls.from_json(data, f"state file {path}", allow_unsealed=allow_unsealed)


def checkpoint_sha256(data: dict[str, Any]) -> str:
    """The ``sha256`` a checkpoint's JSON carries: SHA-256 of the canonical JSON (sorted keys,
    no whitespace) of every field but ``sha256`` and ``fingerprint_doc`` (which is bound by
    ``fingerprint``, its own SHA-256). Writers that build the JSON by hand (the sidecar) add
    ``"sha256": checkpoint_sha256(doc)``; lane states may be given as parsed JSON."""
    return content_sha256(data, _UNSEALED)


def checkpoint_text(step: int, fingerprint: str, lanes_total: int,
                    lanes: Iterable[tuple[int, str]], fingerprint_doc_json: str) -> str:
    """``json.dumps(checkpoint.to_json(), separators=(",", ":"))``, byte for byte, from lane
    states already in that compact form and the fingerprint document serialized once.

    For writers that keep lane states as text and must not serialize a large fingerprint
    document per checkpoint (the sidecar's kept step boundaries); the seal is computed over
    the lane states, so its cost does not grow with the number of source files.
    """
    lanes = list(lanes)
    parsed = {str(k): json.loads(text) for k, text in lanes}
    sha = checkpoint_sha256({"format": CHECKPOINT_FORMAT, "step": step,
                             "fingerprint": fingerprint, "lanes_total": lanes_total,
                             "lanes": parsed})
    body = ",".join(f'"{k}":{text}' for k, text in lanes)
    return (f'{{"format":{json.dumps(CHECKPOINT_FORMAT)},"step":{step},'
            f'"fingerprint":{json.dumps(fingerprint)},"lanes_total":{lanes_total},'
            f'"lanes":{{{body}}},"fingerprint_doc":{fingerprint_doc_json},"sha256":"{sha}"}}')


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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(v: Any, where: str, lo: int = 0, hi: int = _MAX_INT) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MismatchError(f"{where} must be an integer, got {_short(v)}")
    if v < lo:
        raise MismatchError(f"{where} must be at least {lo}, got {v}")
    if v > hi:
        top = "2^63 - 1" if hi == _MAX_INT else str(hi)
        raise MismatchError(f"{where} must be at most {top}, got {_short(v)}")
    return v


def _float(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise MismatchError(f"{where} must be a finite number, got {_short(v)}")
    return float(v)


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise MismatchError(f"{where} must be a list, got {type(data).__name__} {_short(data)}")
    return data


def _ints(data: Any, where: str, names: tuple[str, ...],
          lows: Mapping[str, int] | None = None) -> list[int]:
    """The integers ``names``, each at least 0 (or its entry in ``lows``)."""
    if not isinstance(data, list) or len(data) != len(names):
        raise MismatchError(f"{where} must be a list of {len(names)} integers "
                            f"[{', '.join(names)}], got {_short(data)}")
    return [_int(v, f"{where} {name}", lo=(lows or {}).get(name, 0))
            for v, name in zip(data, names, strict=True)]

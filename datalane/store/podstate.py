"""The pod object: one pod's lane states at one step (``datalane.pod-state/v1``).

A sidecar writes one of these per checkpoint step, holding every lane its pod's ranks own,
so the object count of a checkpoint scales with pods, not lanes::

    {"format": "datalane.pod-state/v1", "step": 30, "pod": "0",
     "fingerprint": "83122a9e...", "fingerprint_doc": {...}, "lanes_total": 8,
     "lanes": {"0": {<LaneState JSON>}, "1": {...}},
     "digests": {"20": {"0": "<hex window digest>", "1": "..."}, ..., "29": {...}}}

``digests`` holds the lane-window digests (:func:`datalane.spec.hashing.window_digest`) of
the steps the pod served since the previous committed checkpoint; the manifest composes them
into the ledger of global batch hashes. The bytes are canonical JSON (sorted keys, compact),
so the same state always encodes to the same bytes.

Pure encoding and validation, no I/O. Callers: :mod:`datalane.store.store`,
:mod:`datalane.store.manifest`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import ConfigError, MismatchError, StorageError
from datalane.spec.state import LaneState

__all__ = ["POD_STATE_FORMAT", "SHA256_HEX", "PodObject", "canonical_json", "lane_sha256",
           "number_key", "sha256_hex"]

POD_STATE_FORMAT = "datalane.pod-state/v1"
#: a SHA-256 in lowercase hex; match whole strings with ``fullmatch`` (a ``$`` lets a final
#: newline through)
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_KEYS = {"format", "step", "pod", "fingerprint", "fingerprint_doc", "lanes_total", "lanes",
         "digests"}


def corrupt_error(kind: str, uri: str, why: str) -> StorageError:
    """The error for a stored document that cannot be used (never worth a retry)."""
    return StorageError(f"corrupt {kind} {uri}: {why}", transient=False)


def parse_document(data: bytes, uri: str, kind: str, fmt: str,
                   keys: frozenset[str] | set[str],
                   optional: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """A stored JSON object of format ``fmt`` with exactly ``keys`` (and any of ``optional``):
    StorageError naming ``uri`` if corrupt, MismatchError if it is another format (version)."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupt_error(kind, uri, f"not valid JSON ({len(data)} bytes; truncated?): "
                                       f"{e}") from e
    if not isinstance(doc, dict):
        raise corrupt_error(kind, uri, f"expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != fmt:
        raise MismatchError(f"{kind} {uri} has format {doc.get('format')!r}; this datalane "
                            f"reads {fmt!r}")
    extra, missing = sorted(set(doc) - keys - optional), sorted(keys - set(doc))
    if extra or missing:
        raise corrupt_error(kind, uri, f"unknown keys {extra}, missing keys {missing}")
    return doc


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace: the byte form every hash in the store is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lane_sha256(lane_json: Mapping[str, Any]) -> str:
    """SHA-256 of a lane state's canonical JSON (what a manifest lists per lane)."""
    return sha256_hex(canonical_json(lane_json))


def _digest_hex(value: bytes | str, where: str) -> str:
    if isinstance(value, bytes):
        if len(value) != 32:
            raise ConfigError(f"{where} must be a 32-byte SHA-256 digest, got {len(value)} bytes")
        return value.hex()
    if isinstance(value, str) and SHA256_HEX.fullmatch(value.lower()):
        return value.lower()
    raise ConfigError(f"{where} must be a 32-byte digest or 64 hex characters, got {value!r}")


@dataclass(frozen=True)
class PodObject:
    """The decoded content of ``pod-<id>.json``."""

    step: int
    pod: str
    fingerprint: str
    fingerprint_doc: dict[str, Any] | None
    lanes_total: int
    lanes: dict[int, LaneState]
    """Lane index -> its resume point at ``step``."""
    lane_json: dict[int, dict[str, Any]]
    """Lane index -> the lane state's JSON exactly as stored (what its SHA-256 is taken over)."""
    digests: dict[int, dict[int, str]]
    """Step -> lane -> hex window digest, for the steps served since the previous checkpoint."""

    @classmethod
    def build(cls, step: int, pod: str, lanes: Mapping[int, LaneState],
              digests: Mapping[int, Mapping[int, bytes | str]], fingerprint: str,
              fingerprint_doc: dict[str, Any] | None, lanes_total: int) -> PodObject:
        """Validate a writer's arguments (ConfigError naming the bad value) into a record."""
        if isinstance(lanes_total, bool) or not isinstance(lanes_total, int) or lanes_total < 1:
            raise ConfigError(f"lanes_total must be a positive integer, got {lanes_total!r}")
        if not isinstance(fingerprint, str) or not fingerprint:
            raise ConfigError(f"fingerprint must be a non-empty string, got {fingerprint!r}")
        if fingerprint_doc is not None and not isinstance(fingerprint_doc, dict):
            raise ConfigError("fingerprint_doc must be a dict or None, got "
                              f"{type(fingerprint_doc).__name__}")
        if not lanes:
            raise ConfigError(f"pod {pod} has no lane state to write for step {step}")
        states: dict[int, LaneState] = {}
        for lane, state in sorted(lanes.items()):
            if not isinstance(state, LaneState) or state.lane != lane:
                got = state.lane if isinstance(state, LaneState) else type(state).__name__
                raise ConfigError(f"lanes[{lane}] of pod {pod} holds the state of lane {got}")
            if not 0 <= lane < lanes_total:
                raise ConfigError(f"lane {lane} of pod {pod} is outside 0..{lanes_total - 1}")
            states[lane] = state
        hexes: dict[int, dict[int, str]] = {}
        for served, per_lane in sorted(digests.items()):
            if isinstance(served, bool) or not isinstance(served, int) or not 0 <= served < step:
                raise ConfigError(f"pod {pod} gives digests for step {served!r}; a checkpoint "
                                  f"of step {step} can only carry steps 0..{step - 1}")
            row: dict[int, str] = {}
            for lane, digest in sorted(per_lane.items()):
                if not 0 <= lane < lanes_total:
                    raise ConfigError(f"digest of step {served} names lane {lane}, outside "
                                      f"0..{lanes_total - 1}")
                row[lane] = _digest_hex(digest, f"digest of step {served} lane {lane}")
            hexes[served] = row
        return cls(step, pod, fingerprint, fingerprint_doc, lanes_total, states,
                   {k: v.to_json() for k, v in states.items()}, hexes)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": POD_STATE_FORMAT,
            "step": self.step,
            "pod": self.pod,
            "fingerprint": self.fingerprint,
            "fingerprint_doc": self.fingerprint_doc,
            "lanes_total": self.lanes_total,
            "lanes": {str(k): v for k, v in sorted(self.lane_json.items())},
            "digests": {str(s): {str(lane): d for lane, d in sorted(row.items())}
                        for s, row in sorted(self.digests.items())},
        }

    def encode(self) -> bytes:
        """The object's bytes: canonical JSON and a newline."""
        return canonical_json(self.to_json()) + b"\n"

    @classmethod
    def decode(cls, data: bytes, uri: str) -> PodObject:
        """Parse and validate an object's bytes; StorageError naming ``uri`` if corrupt."""
        def corrupt(why: str) -> StorageError:
            return corrupt_error("pod object", uri, why)

        doc = parse_document(data, uri, "pod object", POD_STATE_FORMAT, _KEYS)
        try:
            step, lanes_total = _int(doc["step"]), _int(doc["lanes_total"])
            lane_json = {number_key(k): v for k, v in dict(doc["lanes"]).items()}
            digests = {number_key(s): {number_key(lane): str(d) for lane, d in dict(row).items()}
                       for s, row in dict(doc["digests"]).items()}
        except (TypeError, ValueError) as e:
            raise corrupt(f"malformed field: {e}") from e
        if step < 0:
            raise corrupt(f"step {step} is not a step (0 or more)")
        if lanes_total < 1:
            raise corrupt(f"lanes_total {lanes_total} is not a lane count (1 or more)")
        if not lane_json:
            raise corrupt("it holds no lane state (a pod writes the lanes its ranks own)")
        if not isinstance(doc["fingerprint"], str) or not isinstance(doc["pod"], str):
            raise corrupt("fingerprint and pod must be strings")
        fp_doc = doc["fingerprint_doc"]
        if fp_doc is not None and not isinstance(fp_doc, dict):
            raise corrupt("fingerprint_doc must be an object or null")
        states: dict[int, LaneState] = {}
        for lane, js in lane_json.items():
            if not isinstance(js, dict):
                raise corrupt(f"lane {lane} is not a JSON object")
            state = LaneState.from_json(js, f"lane {lane} of {uri}")
            if state.lane != lane or not 0 <= lane < lanes_total:
                raise corrupt(f"entry {lane} holds the state of lane {state.lane} "
                              f"({lanes_total} lanes in total)")
            states[lane] = state
        for s, row in digests.items():
            for lane, d in row.items():
                if not SHA256_HEX.fullmatch(d) or not 0 <= lane < lanes_total or not 0 <= s < step:
                    raise corrupt(f"bad digest entry step {s} lane {lane}: {d!r}")
        return cls(step, doc["pod"], doc["fingerprint"], fp_doc, lanes_total, states,
                   lane_json, digests)


def number_key(k: str) -> int:
    """A number key of a stored JSON object (a lane, a step) as its writer writes it: decimal
    digits, no sign, padding or spaces (``"01"`` beside ``"1"`` would be two entries for one
    lane, the last one read silently winning)."""
    if not (k.isdecimal() and k.isascii() and (k == "0" or not k.startswith("0"))):
        raise ValueError(f"key {k!r} is not a decimal number as a writer spells it")
    return int(k)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v

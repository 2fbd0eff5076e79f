"""The manifest: the commit marker of a checkpoint step (``datalane.manifest/v1``).

``<base>/steps/<step>/MANIFEST.json`` lists every lane state of the step with its SHA-256,
every pod object with the SHA-256 of its bytes, the ledger of global batch hashes, and a link
to the previous committed manifest::

    {"format": "datalane.manifest/v1", "step": 30, "lanes_total": 8,
     "fingerprint": "83122a9e...", "fingerprint_doc": {...},
     "lanes": {"0": {"object": "pod-0.json", "sha256": "<lane state sha256>"}, ...},
     "objects": {"pod-0.json": "<object sha256>", "pod-1.json": "..."},
     "ledger": [[20, "<global hash of step 20>"], ..., [29, "..."]],
     "previous": {"step": 20, "sha256": "<sha256 of step 20's MANIFEST bytes>"}}

The manifest is a *pure function* of the step's pod objects and the previous manifest
(:func:`build_manifest`), encoded as canonical JSON. Hence two writers racing to commit the
same step write identical bytes, and a reader verifies a manifest by deriving it again from
the objects it lists and comparing bytes: any edit of a lane hash, an object hash, the ledger
or the lane map is caught.

A checkpoint written under a recipe with phases also lists where each phase begins, as the
recipe of its pod objects says (``fingerprint_doc``), in recipe order; a recipe without
phases writes no ``phases`` key, so manifests of such runs (and of datalane before phases)
keep their bytes::

     "phases": [{"name": "warmup", "start_step": 0}, {"name": "anneal", "start_step": 500}]

Each manifest thus records which phases existed when it was written; the audit
(:mod:`datalane.store.audit`) finds where a phase was appended and proves that the steps
before it are unchanged.

The ledger holds, for every step ``t`` with ``previous.step <= t < step`` (all steps below
``step`` for the first checkpoint) for which the pod objects carry the window digest of
every lane, ``global_hash`` of those digests in lane order. A checkpoint of step ``s`` is the
state *before* step ``s`` is served, so consecutive manifests' ledgers tile the steps with
no gap and no overlap; :mod:`datalane.store.audit` checks that they do.

Every manifest this datalane commits also counts its place in the chain, ``"seq": 7`` (0 for
the first; absent in manifests of older datalanes, which keep their bytes): the audit then
knows how many checkpoints came before the oldest one kept, and the store keeps ``HEAD.json``
and gc records, which tell a cut head or tail from a garbage collection
(:mod:`datalane.store.history`).

Pure functions, no I/O. Callers: :mod:`datalane.store.store`, :mod:`datalane.store.audit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import MismatchError, StorageError
from datalane.spec.hashing import global_hash
from datalane.store.amendments import PhaseStart, recorded_phases, same_consumed_prefix
from datalane.store.layout import is_pod_object_name
from datalane.store.podstate import (
    SHA256_HEX,
    PodObject,
    canonical_json,
    corrupt_error,
    lane_sha256,
    number_key,
    parse_document,
    sha256_hex,
)

__all__ = ["MANIFEST_FORMAT", "LaneEntry", "Manifest", "PodRead", "build_manifest"]

MANIFEST_FORMAT = "datalane.manifest/v1"
_KEYS = {"format", "step", "fingerprint", "fingerprint_doc", "lanes_total", "lanes", "objects",
         "ledger", "previous"}
_OPTIONAL = {"phases",  # only when the recipe has phases: older manifests keep their bytes
             "seq"}  # in every manifest since issue 23; absent in those of older datalanes


@dataclass(frozen=True)
class PodRead:
    """A pod object as read from storage: its name, URI, exact bytes and decoded content."""

    name: str
    uri: str
    data: bytes
    pod: PodObject


@dataclass(frozen=True)
class LaneEntry:
    """Where a lane's state lives in a committed step and the SHA-256 of its canonical JSON."""

    object: str
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A decoded ``MANIFEST.json``."""

    step: int
    fingerprint: str
    fingerprint_doc: dict[str, Any] | None
    lanes_total: int
    lanes: dict[int, LaneEntry]
    objects: dict[str, str]
    """Pod object name -> SHA-256 of its bytes."""
    ledger: tuple[tuple[int, str], ...]
    """``(step, global batch hash)`` for the steps served since the previous checkpoint."""
    previous_step: int | None
    previous_sha256: str | None
    phases: tuple[PhaseStart, ...] = ()
    """Where each phase of the recipe the checkpoint was written under begins (recipe order);
    empty for a recipe without phases."""
    seq: int | None = None
    """Its place in the hash chain: 0 for the first manifest (or the first one written by a
    datalane that counts), the previous one's + 1 otherwise; None in manifests of older
    datalanes. A store whose manifests count also keeps ``HEAD.json`` and gc records
    (:mod:`datalane.store.history`)."""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "step": self.step,
            "fingerprint": self.fingerprint,
            "fingerprint_doc": self.fingerprint_doc,
            "lanes_total": self.lanes_total,
            "lanes": {str(k): {"object": e.object, "sha256": e.sha256}
                      for k, e in sorted(self.lanes.items())},
            "objects": dict(sorted(self.objects.items())),
            "ledger": [[s, h] for s, h in self.ledger],
            "previous": {"step": self.previous_step, "sha256": self.previous_sha256},
        }
        if self.phases:
            doc["phases"] = [{"name": p.name, "start_step": p.start_step} for p in self.phases]
        if self.seq is not None:
            doc["seq"] = self.seq
        return doc

    def encode(self) -> bytes:
        """Canonical JSON and a newline: equal manifests have equal bytes."""
        return canonical_json(self.to_json()) + b"\n"

    def objects_for(self, lanes: Sequence[int]) -> list[str]:
        """Names of the pod objects holding ``lanes`` (sorted, without repeats)."""
        return sorted({self.lanes[lane].object for lane in lanes})

    @classmethod
    def decode(cls, data: bytes, uri: str) -> Manifest:
        """Parse and check the structure of a manifest; StorageError naming ``uri`` if corrupt."""
        def corrupt(why: str) -> StorageError:
            return corrupt_error("manifest", uri, why)

        doc = parse_document(data, uri, "manifest", MANIFEST_FORMAT, _KEYS, _OPTIONAL)
        try:
            step, lanes_total = _int(doc["step"]), _int(doc["lanes_total"])
            lanes = {number_key(k): LaneEntry(_str(v["object"]), _hex(v["sha256"]))
                     for k, v in dict(doc["lanes"]).items()}
            objects = {_str(k): _hex(v) for k, v in dict(doc["objects"]).items()}
            ledger = tuple((_int(s), _hex(h)) for s, h in doc["ledger"])
            prev = dict(doc["previous"])
            prev_step = None if prev["step"] is None else _int(prev["step"])
            prev_sha = None if prev["sha256"] is None else _hex(prev["sha256"])
            fingerprint = _str(doc["fingerprint"])
            phases = tuple(PhaseStart(_str(p["name"]), _int(p["start_step"]))
                           for p in doc.get("phases", ()))
            seq = _int(doc["seq"]) if "seq" in doc else None
        except (TypeError, ValueError, KeyError) as e:
            raise corrupt(f"malformed field: {e!r}") from e
        fp_doc = doc["fingerprint_doc"]
        if fp_doc is not None and not isinstance(fp_doc, dict):
            raise corrupt("fingerprint_doc must be an object or null")
        if sorted(lanes) != list(range(lanes_total)):
            raise corrupt(f"lists lanes {sorted(lanes)[:8]}..., not exactly 0..{lanes_total - 1}")
        for lane, entry in lanes.items():
            if entry.object not in objects:
                raise corrupt(f"lane {lane} is in {entry.object}, which the manifest does not "
                              f"list among its objects")
        if any(not is_pod_object_name(name) for name in objects):
            raise corrupt(f"object names {sorted(objects)} are not all pod objects")
        if (prev_step is None) != (prev_sha is None):
            raise corrupt("previous.step and previous.sha256 must both be set or both be null")
        if "phases" in doc and not phases:
            raise corrupt("phases must list at least one phase when present")
        if seq is not None and seq < 0:
            raise corrupt(f"seq must be at least 0, got {seq}")
        return cls(step, fingerprint, fp_doc, lanes_total, lanes, objects, ledger, prev_step,
                   prev_sha, phases, seq)


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {v!r}")
    return v


def _hex(v: Any) -> str:
    if not isinstance(v, str) or not SHA256_HEX.fullmatch(v):
        raise ValueError(f"expected a 64-character lowercase hex SHA-256, got {v!r}")
    return v


def _lane_owners(step: int, pods: Sequence[PodRead]) -> dict[int, PodRead]:
    """Lane -> the pod object holding it (the first by name when several hold the same state);
    MismatchError when objects disagree, or hold different states of one lane.

    A lane's state at a step does not depend on the topology, so a stale object of an earlier
    topology (a run that died before committing the step, then resumed on other pods) holds
    the very same states: it is harmless, and the step commits without a manual discard. Two
    different states of one lane are a real conflict (a non-deterministic source, files changed
    under the recipe).
    """
    head = pods[0]
    owners: dict[int, PodRead] = {}
    for p in pods:
        if p.pod.step != step:
            raise MismatchError(f"{p.uri} holds the state of step {p.pod.step}, not {step}")
        if p.name != f"pod-{p.pod.pod}.json":
            raise MismatchError(f"{p.uri} claims to be the object of pod {p.pod.pod!r}")
        if p.pod.fingerprint != head.pod.fingerprint:
            hint = ""
            if same_consumed_prefix(head.pod.fingerprint, head.pod.fingerprint_doc,
                                    p.pod.fingerprint, p.pod.fingerprint_doc, step):
                hint = (f"; both recipes served the same steps so far (phases that start at or "
                        f"after step {step} differ: the recipe was edited and only some pods "
                        f"restarted since); restart every pod of the job so that all serve the "
                        f"same recipe, or discard the uncommitted step if it holds stale "
                        f"objects")
            raise MismatchError(
                f"step {step} mixes recipes: {head.uri} has fingerprint "
                f"{head.pod.fingerprint[:16]}..., {p.uri} has {p.pod.fingerprint[:16]}..."
                f"{hint}")
        if p.pod.lanes_total != head.pod.lanes_total:
            raise MismatchError(f"step {step} mixes lane counts: {head.uri} has "
                                f"{head.pod.lanes_total} lanes, {p.uri} has {p.pod.lanes_total}")
        for lane in p.pod.lanes:
            first = owners.get(lane)
            if first is None:
                owners[lane] = p
            elif lane_sha256(first.pod.lane_json[lane]) != lane_sha256(p.pod.lane_json[lane]):
                raise MismatchError(
                    f"lane {lane} of step {step} has two different states, in {first.uri} and "
                    f"{p.uri}; a lane's state at a step never depends on the pod that wrote "
                    f"it (a non-deterministic source, or files changed under the recipe?); "
                    f"discard the uncommitted step and write it again")
    return owners


def _ledger(step: int, pods: Sequence[PodRead], lanes_total: int,
            since: int | None) -> tuple[tuple[int, str], ...]:
    table: dict[int, dict[int, tuple[str, str]]] = {}
    for p in pods:
        for served, row in p.pod.digests.items():
            cells = table.setdefault(served, {})
            for lane, digest in row.items():
                seen = cells.setdefault(lane, (digest, p.uri))
                if seen[0] != digest:
                    raise MismatchError(
                        f"step {served} lane {lane} has two window digests: {seen[0][:16]}... "
                        f"in {seen[1]} and {digest[:16]}... in {p.uri}")
    ledger = []
    for served in sorted(table):
        if (since is not None and served < since) or served >= step:
            continue
        cells = table[served]
        if len(cells) == lanes_total:
            digests = (bytes.fromhex(cells[lane][0]) for lane in range(lanes_total))
            ledger.append((served, global_hash(digests)))
    return tuple(ledger)


def build_manifest(step: int, pods: Sequence[PodRead], previous: tuple[int, str] | None,
                   seq: int | None = None) -> Manifest | None:
    """The manifest of ``step`` from its pod objects, or None while a lane is missing.

    ``pods`` are the objects as read back from storage (their bytes are hashed as read);
    ``previous`` is ``(step, sha256 of its MANIFEST bytes)`` of the newest committed step
    below ``step``, ``seq`` the manifest's place in the chain (None: a manifest of a datalane
    before it counted). Raises MismatchError if the objects disagree on the recipe or lane
    count, or hold different states of a lane.
    """
    if not pods:
        return None
    pods = sorted(pods, key=lambda p: p.name)
    owners = _lane_owners(step, pods)
    head = pods[0].pod
    if sorted(owners) != list(range(head.lanes_total)):
        return None
    lanes = {lane: LaneEntry(p.name, lane_sha256(p.pod.lane_json[lane]))
             for lane, p in sorted(owners.items())}
    since = previous[0] if previous is not None else None
    return Manifest(
        step=step,
        fingerprint=head.fingerprint,
        fingerprint_doc=head.fingerprint_doc,
        lanes_total=head.lanes_total,
        lanes=lanes,
        objects={p.name: sha256_hex(p.data) for p in pods},
        ledger=_ledger(step, pods, head.lanes_total, since),
        previous_step=since,
        previous_sha256=previous[1] if previous is not None else None,
        phases=recorded_phases(head.fingerprint_doc),
        seq=seq,
    )


def missing_lanes(pods: Sequence[PodRead]) -> list[int]:
    """Lanes that none of ``pods`` holds (all of them if there are no pods)."""
    if not pods:
        return []
    held = {lane for p in pods for lane in p.pod.lanes}
    return [lane for lane in range(pods[0].pod.lanes_total) if lane not in held]

"""The store's history records: ``HEAD.json`` and gc records, so that a cut head or tail shows.

The hash chain of manifests shows a manifest removed from its middle (the next one links to
it), not one removed at either end: deleting the newest steps, or the oldest, leaves a
shorter chain that verifies. Three things close that gap:

* every manifest counts its place in the chain (``seq``, :mod:`datalane.store.manifest`), so
  the oldest one kept says how many checkpoints came before it;
* ``<base>/HEAD.json`` (``datalane.head/v1``) names the newest committed step and the SHA-256
  of its manifest; a commit that moves the head forward rewrites it, after the manifest. The
  audit requires the step it names to be present with those bytes, so removing the newest
  steps is reported as such;
* ``<base>/gc/<step:012d>.json`` (``datalane.gc-record/v1``, named by the newest step it
  removed) is written by garbage collection *before* it deletes committed steps: each removed
  step with its manifest's SHA-256, ``seq`` and ``previous`` link. The audit follows the
  hash chain from the oldest step present back through the gc records to the first
  checkpoint (``previous`` null); a link to a step that is gone with no gc record saying so is
  reported as the oldest steps deleted::

    {"format": "datalane.head/v1", "step": 50, "sha256": "<manifest sha256>", "seq": 4,
     "signature": {"key_id": "...", "hmac_sha256": "..."}}
    {"format": "datalane.gc-record/v1", "kept": [40, 50],
     "removed": [{"step": 10, "sha256": "...", "seq": 0, "previous": null},
                 {"step": 20, "sha256": "...", "seq": 1,
                  "previous": {"step": 10, "sha256": "..."}}],
     "signature": {...}}

With a ledger key both records are signed (:func:`datalane.store.signing.sign_document`), and
an audit with the key refuses unsigned or forged ones: a writer without the key can neither
write a gc record for steps they deleted nor a HEAD.json for a shorter history. A store
whose manifests carry ``seq`` was written by a datalane that keeps these records, so a
missing HEAD.json or an unaccounted gap at the tail is a problem; a store of an older datalane
audits as before, with notes saying what cannot be proven there.

What the records cannot prove: a writer who kept a copy of an older signed HEAD.json can put
it back after deleting the newer steps (a signature proves who wrote a record, not that it is
the newest). Compare the newest step with a record kept outside the bucket (the operator's
``status.lastCommittedStep``, the trainer's own checkpoints).

Pure functions, no I/O. Callers: :mod:`datalane.store.store` (writing, reading),
:mod:`datalane.store.audit` (the verdict).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datalane.store.manifest import Manifest
from datalane.store.podstate import SHA256_HEX, canonical_json
from datalane.store.signing import document_signature_problem, sign_document

__all__ = [
    "GC_FORMAT",
    "HEAD_FORMAT",
    "Head",
    "History",
    "Removed",
    "audit_history",
    "gc_record",
    "head_record",
    "read_gc_record",
    "read_head",
]

HEAD_FORMAT = "datalane.head/v1"
GC_FORMAT = "datalane.gc-record/v1"


@dataclass(frozen=True)
class Head:
    """What ``HEAD.json`` says: the newest committed step and its manifest's SHA-256."""

    step: int
    sha256: str
    seq: int | None


@dataclass(frozen=True)
class Removed:
    """A committed step a garbage collection removed, as its gc record lists it."""

    step: int
    sha256: str
    seq: int | None
    previous: tuple[int, str] | None
    record: str
    """The URI of the gc record."""


@dataclass
class History:
    """The history records of a store as read (the input of :func:`audit_history`)."""

    head_uri: str
    head: Head | None = None
    head_problem: str | None = None
    """Why HEAD.json cannot be used (unreadable, unsigned, forged); None if fine or absent."""
    removed: dict[int, Removed] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """gc records that cannot be used, and why."""


def head_record(key: bytes | None, step: int, sha256: str, seq: int | None) -> bytes:
    """The bytes of ``HEAD.json`` (signed with ``key`` when there is one)."""
    doc = {"format": HEAD_FORMAT, "step": step, "sha256": sha256, "seq": seq}
    return canonical_json(sign_document(key, HEAD_FORMAT, doc)) + b"\n"


def gc_record(key: bytes | None, removed: Sequence[tuple[int, str, Manifest | None]],
              kept: Sequence[int], carried: Sequence[Removed] = ()) -> bytes:
    """The bytes of a gc record for the committed steps ``removed`` (step, SHA-256 of its
    manifest bytes, its manifest if it parses) and the committed steps ``kept``.

    ``carried`` are the entries of the record this one replaces (a collection interrupted
    after deleting some of its steps, run again: its record has the same name, the newest step
    removed), kept for the steps ``removed`` does not list, so none goes unaccounted."""
    entries = {step: {"step": step, "sha256": sha, "seq": m.seq if m is not None else None,
                      "previous": None if m is None or m.previous_step is None else
                      {"step": m.previous_step, "sha256": m.previous_sha256}}
               for step, sha, m in removed}
    for r in carried:
        entries.setdefault(r.step, {
            "step": r.step, "sha256": r.sha256, "seq": r.seq,
            "previous": None if r.previous is None else
            {"step": r.previous[0], "sha256": r.previous[1]}})
    doc = {"format": GC_FORMAT, "removed": [entries[s] for s in sorted(entries)],
           "kept": sorted(kept)}
    return canonical_json(sign_document(key, GC_FORMAT, doc)) + b"\n"


def _load(data: bytes, uri: str, fmt: str, keys: set[str],
          key: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, f"{uri} is not valid JSON ({len(data)} bytes)"
    if not isinstance(doc, dict) or doc.get("format") != fmt or not keys <= set(doc):
        return None, f"{uri} is not a {fmt} document"
    if key is not None:
        problem = document_signature_problem(key, fmt, doc, uri)
        if problem is not None:
            return None, problem
    return doc, None


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"expected a non-negative integer, got {v!r}")
    return v


def _hex(v: Any) -> str:
    if not isinstance(v, str) or not SHA256_HEX.fullmatch(v):
        raise ValueError(f"expected a SHA-256 (64 lowercase hex digits), got {v!r}")
    return v


def read_head(data: bytes, uri: str, key: bytes | None) -> tuple[Head | None, str | None]:
    """``HEAD.json`` parsed (and its signature checked with ``key``), or why it cannot be."""
    doc, problem = _load(data, uri, HEAD_FORMAT, {"step", "sha256", "seq"}, key)
    if doc is None:
        return None, problem
    try:
        seq = None if doc["seq"] is None else _int(doc["seq"])
        return Head(_int(doc["step"]), _hex(doc["sha256"]), seq), None
    except ValueError as e:
        return None, f"{uri} is malformed: {e}"


def read_gc_record(data: bytes, uri: str,
                   key: bytes | None) -> tuple[list[Removed], str | None]:
    """The steps a gc record lists as removed (its signature checked with ``key``), or why it
    cannot be used."""
    doc, problem = _load(data, uri, GC_FORMAT, {"removed", "kept"}, key)
    if doc is None:
        return [], problem
    out = []
    try:
        for e in doc["removed"]:
            prev = e["previous"]
            out.append(Removed(_int(e["step"]), _hex(e["sha256"]),
                               None if e["seq"] is None else _int(e["seq"]),
                               None if prev is None else (_int(prev["step"]),
                                                          _hex(prev["sha256"])), uri))
    except (TypeError, KeyError, ValueError) as e:
        return [], f"{uri} is malformed: {e!r}"
    return out, None


@dataclass(frozen=True)
class Verdict:
    """What :func:`audit_history` found: store-wide problems and the report's lines."""

    problems: tuple[str, ...]
    lines: tuple[str, ...]


def _counted(manifests: Mapping[int, tuple[str, Manifest | None]]) -> bool:
    return any(m is not None and m.seq is not None for _, m in manifests.values())


def _head(manifests: Mapping[int, tuple[str, Manifest | None]], history: History,
          problems: list[str], lines: list[str]) -> None:
    newest = max(manifests, default=None)
    uri = history.head_uri
    if history.head_problem is not None:
        problems.append(f"the newest checkpoints cannot be proven present: "
                        f"{history.head_problem}")
        return
    head = history.head
    if head is None and newest is None:
        return
    if head is None:
        if _counted(manifests):
            problems.append(f"{uri} is missing, although this store's checkpoints were "
                            f"committed by a datalane that writes it: it was deleted, and "
                            f"whether the newest checkpoints were too cannot be proven")
        else:
            lines.append(f"head: no {uri} (checkpoints of a datalane before it was kept): "
                         f"whether the newest checkpoints were removed cannot be proven; "
                         f"compare step {newest} with a record kept elsewhere")
        return
    found = manifests.get(head.step)
    if found is None:
        left = ("no committed checkpoint is left" if newest is None
                else f"the newest present is step {newest}")
        problems.append(f"the newest checkpoints were removed: {uri} names step {head.step} "
                        f"(manifest {head.sha256[:16]}...), which is not in the store; {left}")
        return
    if found[0] != head.sha256:
        problems.append(f"{uri} names step {head.step} with manifest {head.sha256[:16]}..., "
                        f"but that manifest hashes to {found[0][:16]}... (replaced since)")
        return
    later = sorted(s for s in manifests if s > head.step)
    extra = (f"; steps {', '.join(map(str, later))} were committed after it was last written "
             f"(a commit interrupted before it)") if later else ""
    lines.append(f"head: step {head.step}, as {uri} records{extra}")


def _tail(manifests: Mapping[int, tuple[str, Manifest | None]], history: History,
          problems: list[str], lines: list[str]) -> None:
    """Follow the chain from the oldest manifest back through the gc records."""
    oldest = min(manifests)
    m = manifests[oldest][1]
    if m is None:
        lines.append(f"history: the oldest manifest, of step {oldest}, cannot be read; what "
                     f"came before it cannot be proven")
        return
    link = None if m.previous_step is None or m.previous_sha256 is None else (
        m.previous_step, m.previous_sha256)
    counted, seq = m.seq is not None, m.seq
    removed: list[Removed] = []
    while link is not None:
        entry = history.removed.get(link[0])
        if entry is None or entry.sha256 != link[1]:
            break
        if seq is not None and entry.seq is not None and entry.seq != seq - 1:
            problems.append(f"{entry.record} lists step {entry.step} at place {entry.seq} of "
                            f"the hash chain, but the checkpoint after it is at place {seq}")
        removed.append(entry)
        seq = entry.seq
        counted = counted or seq is not None
        link = entry.previous
    records = sorted({e.record for e in removed})
    by_gc = (f"; {len(removed)} checkpoints before step {oldest} were garbage-collected "
             f"(steps {_runs(sorted(e.step for e in removed))}; "
             f"{', '.join(records)})") if removed else ""
    if link is None:
        lines.append(f"history: complete back to the first checkpoint{by_gc}")
        return
    below = removed[-1].step if removed else oldest
    if counted and (seq or 0) > 0:
        problems.append(f"the oldest checkpoints were removed: step {below} links to step "
                        f"{link[0]}, which is not in the store, and no gc record says it was "
                        f"garbage-collected ({seq} checkpoints came before step {below})")
    else:
        lines.append(f"history: step {below} links to step {link[0]}, which is not in the "
                     f"store and was removed before gc records were kept (or by hand): what "
                     f"came before step {below} cannot be proven{by_gc}")


def audit_history(manifests: Mapping[int, tuple[str, Manifest | None]],
                  history: History) -> Verdict:
    """Check the head and the tail of a store's history: ``manifests`` maps each committed
    step present to (SHA-256 of its manifest bytes, the manifest if it parses)."""
    problems = list(history.problems)
    lines: list[str] = []
    _head(manifests, history, problems, lines)
    if manifests:
        _tail(manifests, history, problems, lines)
    for step in sorted(s for s in history.removed if s in manifests):
        lines.append(f"note: {history.removed[step].record} lists step {step} as removed, but "
                     f"it is still in the store (a garbage collection was interrupted)")
    return Verdict(tuple(problems), tuple(lines))


def _runs(steps: Sequence[int]) -> str:
    return ", ".join(str(s) for s in steps) if len(steps) <= 6 else (
        f"{', '.join(str(s) for s in steps[:3])}, ..., {steps[-1]}")

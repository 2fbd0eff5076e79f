"""Audit of a checkpoint store: verified manifests, hash chain and ledger continuity.

Every manifest links to the previous committed one by the SHA-256 of its bytes, and records
the global batch hash of every step served since it. :func:`audit_records` takes the
manifests of a store in step order (as read and verified by
:meth:`datalane.store.CheckpointStore.audit`) and checks:

* each manifest verifies against its objects (the store reports the failures it found);
* **hash chain**: ``previous`` names a manifest that is present with exactly those bytes, or
  one older than the oldest present (garbage-collected); a link to a missing step in the
  middle, or to bytes that changed since, breaks the chain;
* **ledger**: entries of one manifest lie in ``[previous.step, step)``; two manifests that
  list the same step agree on its hash; the union of the ledgers covers every step from the
  first entry up to the newest checkpoint, with no gap.
* **head and tail** (:mod:`datalane.store.history`): the newest step HEAD.json names is
  present, and the chain from the oldest step present leads back through the gc records to
  the first checkpoint, so removed newest or oldest steps show, told apart from garbage
  collection.

* **signatures** (with a ledger key): every manifest carries a valid HMAC signature
  (:mod:`datalane.store.signing`); the store reports the ones that do not.
* **recipe amendments**: where two consecutive manifests were written under different
  recipes (phases appended to a running recipe), the consumed prefix of both recipes at the
  earlier step is the same (:func:`datalane.store.amendments.amendment_between`), so the
  steps the ledger recorded before the change are the ones the new recipe would serve; the
  report names each amendment, whether the ledger before it is continuous with the hash
  chain intact, and where each phase begins (and in which checkpoint it first appeared).

Steps committed out of order (a manifest linking past a step that was committed later) are
reported as notes, not failures. :class:`AuditReport` has a JSON form and the text that
``datalane audit STORE`` prints, ledger included. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from datalane.store.amendments import Amendment, PhaseStart, amendment_between
from datalane.store.history import History, audit_history
from datalane.store.manifest import Manifest

__all__ = ["AuditEntry", "AuditReport", "ManifestRecord", "PhaseRecord", "audit_records"]


@dataclass(frozen=True)
class ManifestRecord:
    """One manifest as the store found it (the input of the audit)."""

    step: int
    uri: str
    sha256: str
    """SHA-256 of the manifest's bytes as stored."""
    manifest: Manifest | None
    """The decoded manifest; None if it cannot even be parsed."""
    problem: str | None
    """Why the manifest does not verify against its objects; None if it does."""
    signature: str | None = None
    """Why its HMAC signature does not vouch for it (audits with a key); None if it does."""


@dataclass(frozen=True)
class AuditEntry:
    """The verdict on one committed checkpoint."""

    step: int
    uri: str
    sha256: str
    previous_step: int | None
    ledger: tuple[tuple[int, str], ...]
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    phases: tuple[PhaseStart, ...] = ()
    """The phases of the recipe this checkpoint was written under."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "uri": self.uri, "sha256": self.sha256,
                "previous_step": self.previous_step, "ok": self.ok,
                "ledger": [[s, h] for s, h in self.ledger], "problems": list(self.problems),
                "notes": list(self.notes),
                "phases": [{"name": p.name, "start_step": p.start_step} for p in self.phases]}


@dataclass(frozen=True)
class PhaseRecord:
    """Where a phase begins, as the checkpoints of a store recorded it."""

    name: str
    start_step: int
    """Its start in the newest checkpoint that lists it."""
    first: int
    """The first checkpoint (present in the store) whose recipe has it."""
    last: int
    """The last checkpoint whose recipe has it (the newest, unless it was removed)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "start_step": self.start_step, "first_checkpoint": self.first,
                "last_checkpoint": self.last}


@dataclass(frozen=True)
class AuditReport:
    """The audit of a whole store."""

    uri: str
    entries: tuple[AuditEntry, ...]
    ledger: tuple[tuple[int, str], ...]
    """The union of every manifest's ledger: ``(step, global hash)`` in step order."""
    problems: tuple[str, ...]
    """Store-wide problems: ledger gaps and conflicts."""
    uncommitted: tuple[int, ...]
    """Steps with pod objects but no manifest (in progress or abandoned)."""
    key_id: str | None = None
    """The id of the ledger key every manifest's signature was checked with (None: unchecked)."""
    amendments: tuple[Amendment, ...] = ()
    """Recipe changes between consecutive checkpoints, in step order."""
    phases: tuple[PhaseRecord, ...] = ()
    """Every phase any checkpoint's recipe has, by start step."""
    intact_before: tuple[bool, ...] = ()
    """Per amendment: the ledger is continuous and the hash chain intact before it."""
    history: tuple[str, ...] = ()
    """What HEAD.json and the gc records say of the newest and the oldest steps."""

    @property
    def ok(self) -> bool:
        return not self.problems and all(e.ok for e in self.entries)

    def all_problems(self) -> list[str]:
        return [f"step {e.step}: {p}" for e in self.entries for p in e.problems] + list(
            self.problems)

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "ok": self.ok, "entries": [e.to_json() for e in self.entries],
                "ledger": [[s, h] for s, h in self.ledger], "problems": list(self.problems),
                "uncommitted": list(self.uncommitted), "key_id": self.key_id,
                "amendments": [{**a.to_json(), "ledger_intact_before": intact}
                               for a, intact in zip(self.amendments, self.intact_before,
                                                    strict=True)],
                "phases": [p.to_json() for p in self.phases], "history": list(self.history)}

    def text(self, ledger: bool = True) -> str:
        """Human report: one line per checkpoint, the ledger, and a verdict."""
        steps = ", ".join(str(e.step) for e in self.entries) or "none"
        lines = [f"checkpoint store {self.uri}: {len(self.entries)} committed checkpoints "
                 f"(steps {steps})"]
        for e in self.entries:
            prev = "-" if e.previous_step is None else str(e.previous_step)
            span = _span([s for s, _ in e.ledger]) or "-"
            lines.append(f"  step {e.step:>8}  manifest {e.sha256[:12]}  previous {prev:>8}  "
                         f"ledger {span:<16} {'OK' if e.ok else 'FAILED'}")
            lines.extend(f"      problem: {_indented(p)}" for p in e.problems)
            lines.extend(f"      note: {_indented(n)}" for n in e.notes)
        if self.uncommitted:
            lines.append(f"  uncommitted steps (pod objects, no manifest): "
                         f"{', '.join(map(str, self.uncommitted))}")
        lines.extend(self._phase_lines())
        lines.extend(self.history)
        if ledger:
            lines.append("ledger (global batch hash per step):")
            lines.extend(f"  {s:>8}  {h}" for s, h in self.ledger)
        lines.extend(f"problem: {p}" for p in self.problems)
        if self.ok:
            span = _span([s for s, _ in self.ledger])
            cover = f", ledger continuous over steps {span}" if span else ", ledger empty"
            signed = (f", every manifest signed with ledger key {self.key_id}"
                      if self.key_id is not None else "")
            amended = "".join(f", recipe amended after step {a.before} with the steps before "
                              f"it unchanged" for a in self.amendments)
            lines.append(f"OK: {len(self.entries)} checkpoints verified, hash chain intact"
                         f"{signed}{cover}{amended}")
        else:
            lines.append(f"FAILED: {len(self.all_problems())} problems")
        return "\n".join(lines)


    def _phase_lines(self) -> list[str]:
        """The phase boundaries and the recipe amendments (nothing for a run without)."""
        lines: list[str] = []
        newest = self.entries[-1].step if self.entries else 0
        if self.phases:
            lines.append("phases (where each begins, as the checkpoints' recipes say):")
            oldest = self.entries[0].step
            for p in self.phases:
                if p.first == oldest and p.last == newest:
                    seen = "in every checkpoint"
                elif p.last == newest:
                    seen = f"since checkpoint {p.first}"
                else:
                    seen = f"in checkpoints {p.first}-{p.last}, removed since"
                reached = ("" if p.last != newest else ", served since that step"
                           if p.start_step < newest else ", not reached yet")
                lines.append(f"  {p.name:<16} from step {p.start_step:>8}  {seen}{reached}")
        if self.amendments:
            lines.append("recipe amendments:")
        for a, intact in zip(self.amendments, self.intact_before, strict=True):
            head = f"  after step {a.before} (checkpoint {a.after}): {a.what()}"
            if not a.ok:
                lines.append(f"{head}: FAILED, see the problem of step {a.after}")
                continue
            ledger = ("ledger continuous and hash chain intact before it" if intact else
                      "but the ledger or hash chain before it is broken (problems below)")
            lines.append(f"{head}; steps before {a.before} unchanged (consumed prefix "
                         f"{(a.prefix_fingerprint or '')[:16]}...), {ledger}")
        return lines


def _indented(text: str) -> str:
    """Lines after the first of a multi-line problem (a field diff) under their entry."""
    return text.replace("\n", "\n        ")


def _span(steps: Sequence[int]) -> str:
    return "" if not steps else f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def _runs(steps: Sequence[int]) -> str:
    out: list[tuple[int, int]] = []
    for s in steps:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _chain(rec: ManifestRecord, m: Manifest, by_step: dict[int, ManifestRecord],
           earlier: list[int], oldest: int, problems: list[str], notes: list[str],
           history: History | None) -> None:
    prev = m.previous_step
    if prev is None:
        if earlier:
            notes.append(f"starts a new hash chain although step {earlier[-1]} precedes it "
                         f"(committed out of order?)")
        return
    target = by_step.get(prev)
    if target is None:
        gone = history.removed.get(prev) if history is not None else None
        if gone is not None and gone.sha256 == m.previous_sha256:
            notes.append(f"links to step {prev}, garbage-collected ({gone.record})")
        elif prev < oldest and history is None:
            notes.append(f"links to step {prev}, garbage-collected")
        elif prev >= oldest:
            problems.append(f"broken hash chain: links to step {prev}, whose manifest is "
                            f"missing from the store")
        # else: the tail of the history, which audit_history follows through the gc records
        return
    if target.sha256 != m.previous_sha256:
        problems.append(
            f"broken hash chain: links to step {prev} with manifest SHA-256 "
            f"{(m.previous_sha256 or '')[:16]}..., but {target.uri} hashes to "
            f"{target.sha256[:16]}... (replaced or altered after step {rec.step} was committed)")
    elif earlier and prev != earlier[-1]:
        notes.append(f"links to step {prev}, past step {earlier[-1]} (committed out of order)")


def audit_records(uri: str, records: Sequence[ManifestRecord],
                  uncommitted: Sequence[int] = (), *, key_id: str | None = None,
                  missing: str | None = None, history: History | None = None) -> AuditReport:
    """Audit manifests given in ascending step order.

    ``key_id`` names the ledger key the records' signatures were checked with; ``missing``
    says why there is no store to audit at all (a store-wide problem); ``history`` is the
    store's HEAD.json and gc records (:mod:`datalane.store.history`), whose verdict on the
    newest and the oldest steps joins the report (None: not checked)."""
    by_step = {r.step: r for r in records}
    oldest = records[0].step if records else 0
    union: dict[int, tuple[str, int]] = {}
    store_problems: list[str] = [missing] if missing else []
    entries = []
    earlier: list[int] = []
    amendments: list[Amendment] = []
    conflicts: set[int] = set()
    last: tuple[int, Manifest] | None = None
    for rec in records:
        problems = [p for p in (rec.problem, rec.signature) if p]
        notes: list[str] = []
        m = rec.manifest
        if m is None:
            entries.append(AuditEntry(rec.step, rec.uri, rec.sha256, None, (), tuple(problems),
                                      ()))
            earlier.append(rec.step)
            continue
        _chain(rec, m, by_step, earlier, oldest, problems, notes, history)
        if last is not None:
            amendment = amendment_between(last[0], last[1].fingerprint, last[1].fingerprint_doc,
                                          rec.step, m.fingerprint, m.fingerprint_doc)
            if amendment is not None:
                amendments.append(amendment)
                if amendment.problem is not None:
                    problems.append(amendment.problem)
                else:
                    notes.append(f"recipe amended since checkpoint {last[0]}: "
                                 f"{amendment.what()}; the steps before {last[0]} are "
                                 f"unchanged")
        last = (rec.step, m)
        steps = [s for s, _ in m.ledger]
        lo = m.previous_step if m.previous_step is not None else 0
        if steps != sorted(set(steps)) or any(not lo <= s < m.step for s in steps):
            problems.append(f"ledger entries {_runs(steps)} are not ascending within "
                            f"[{lo}, {m.step})")
        for s, h in m.ledger:
            seen = union.setdefault(s, (h, rec.step))
            if seen[0] != h:
                conflicts.add(s)
                store_problems.append(
                    f"ledger conflict at step {s}: checkpoint {seen[1]} records "
                    f"{seen[0][:16]}..., checkpoint {rec.step} records {h[:16]}...")
        entries.append(AuditEntry(rec.step, rec.uri, rec.sha256, m.previous_step, m.ledger,
                                  tuple(problems), tuple(notes), m.phases))
        earlier.append(rec.step)
    gaps: list[int] = []
    if union:
        newest = max(r.step for r in records)
        gaps = [s for s in range(min(union), newest) if s not in union]
        if gaps:
            store_problems.append(f"ledger gap: no global batch hash for steps {_runs(gaps)}")
    ledger = tuple((s, union[s][0]) for s in sorted(union))
    lines: tuple[str, ...] = ()
    if history is not None:
        verdict = audit_history({r.step: (r.sha256, r.manifest) for r in records}, history)
        store_problems.extend(verdict.problems)
        lines = verdict.lines
    intact = tuple(
        all(e.ok for e in entries if e.step <= a.before)
        and not any(s < a.before for s in (*gaps, *conflicts)) for a in amendments)
    return AuditReport(uri, tuple(entries), ledger, tuple(store_problems), tuple(uncommitted),
                       key_id, tuple(amendments), _phase_records(entries), intact, lines)


def _phase_records(entries: Sequence[AuditEntry]) -> tuple[PhaseRecord, ...]:
    """Every phase of the checkpoints' recipes: its newest start, first and last checkpoint."""
    seen: dict[str, list[int]] = {}  # name -> [start, first, last]
    for e in entries:
        for p in e.phases:
            rec = seen.setdefault(p.name, [p.start_step, e.step, e.step])
            rec[0], rec[2] = p.start_step, e.step
    out = [PhaseRecord(name, start, first, last) for name, (start, first, last) in seen.items()]
    return tuple(sorted(out, key=lambda p: (p.start_step, p.name)))

"""Recipe amendments as the ledger sees them: where each phase began, and proof that a
recipe changed between two checkpoints only where nothing had been served yet.

A run may be resumed under its recipe plus phases that start at or after the resume step
(:mod:`datalane.spec.phases`). Every checkpoint's manifest names the phases of the recipe it
was written under (:func:`recorded_phases`, read from the recipe in its fingerprint
document), so a store holds the history of the recipe: which phases existed at each
checkpoint, and in which checkpoint a phase first appeared.

When two consecutive checkpoints ``E < M`` of a store were written under different recipes,
the run resumed from ``E`` (or later) under the new recipe, and ``M``'s ledger was served
under it from ``E.step`` on. The steps before ``E.step`` were served under the old one; they
are unchanged iff the *consumed prefix* of both recipes at ``E.step``
(:func:`datalane.spec.phases.prefix_document`: phases starting later, sources not used yet
and eval streams dropped) is the same document. :func:`amendment_between` makes that check;
the audit (:mod:`datalane.store.audit`) reports it with the phase boundaries.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datalane.spec.fingerprint import check_fingerprint, fingerprint_of
from datalane.spec.phases import phase_diff, prefix_document

__all__ = ["Amendment", "PhaseStart", "amendment_between", "check_consumed_prefix",
           "recorded_phases", "same_consumed_prefix"]


@dataclass(frozen=True)
class PhaseStart:
    """A phase of a recipe and the step it begins at."""

    name: str
    start_step: int

    def describe(self) -> str:
        return f"{self.name!r} (from step {self.start_step})"


def _phase_docs(fp_doc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The ``phases`` of the recipe in a fingerprint document, as stored (well-formed ones)."""
    recipe = (fp_doc or {}).get("recipe")
    phases = recipe.get("phases") if isinstance(recipe, dict) else None
    if not isinstance(phases, list):
        return []
    return [p for p in phases if isinstance(p, dict) and isinstance(p.get("name"), str)
            and isinstance(p.get("start_step"), int)
            and not isinstance(p.get("start_step"), bool)]


def recorded_phases(fp_doc: Mapping[str, Any] | None) -> tuple[PhaseStart, ...]:
    """Where each phase of the recipe in ``fp_doc`` begins, in recipe order (empty for a
    recipe without phases, or a writer that gave no fingerprint document)."""
    return tuple(PhaseStart(p["name"], p["start_step"]) for p in _phase_docs(fp_doc))


@dataclass(frozen=True)
class Amendment:
    """A change of recipe between two consecutive checkpoints of a store."""

    before: int
    """The step of the earlier checkpoint: the new recipe serves from here on."""
    after: int
    """The step of the first checkpoint written under the new recipe."""
    appended: tuple[PhaseStart, ...]
    """Phases of the new recipe that the old one did not have (by name)."""
    changed: tuple[PhaseStart, ...]
    """Phases of both whose start or content differs (as in the new recipe)."""
    removed: tuple[PhaseStart, ...]
    """Phases of the old recipe that the new one dropped."""
    prefix_fingerprint: str | None
    """Fingerprint of the consumed prefix before ``before``, equal under both recipes;
    None when it is not (see ``problem``)."""
    problem: str | None
    """Why the steps before ``before`` are not proven unchanged; None if they are."""

    @property
    def ok(self) -> bool:
        return self.problem is None

    def what(self) -> str:
        """``phase 'anneal' (from step 500) appended; ...`` or ``the recipe changed``."""
        parts = []
        for label, phases in (("appended", self.appended), ("changed", self.changed),
                              ("removed", self.removed)):
            if phases:
                noun = "phase" if len(phases) == 1 else "phases"
                parts.append(f"{noun} {', '.join(p.describe() for p in phases)} {label}")
        return "; ".join(parts) or "the recipe changed outside its phases"

    def to_json(self) -> dict[str, Any]:
        def starts(phases: Sequence[PhaseStart]) -> list[dict[str, Any]]:
            return [{"name": p.name, "start_step": p.start_step} for p in phases]
        return {"before": self.before, "after": self.after, "ok": self.ok,
                "appended": starts(self.appended), "changed": starts(self.changed),
                "removed": starts(self.removed), "prefix_fingerprint": self.prefix_fingerprint,
                "problem": self.problem}


def _phase_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                ) -> tuple[tuple[PhaseStart, ...], tuple[PhaseStart, ...],
                           tuple[PhaseStart, ...]]:
    a = {p["name"]: p for p in _phase_docs(old)}
    b = {p["name"]: p for p in _phase_docs(new)}
    appended = tuple(PhaseStart(n, p["start_step"]) for n, p in b.items() if n not in a)
    changed = tuple(PhaseStart(n, p["start_step"]) for n, p in b.items()
                    if n in a and a[n] != p)
    removed = tuple(PhaseStart(n, p["start_step"]) for n, p in a.items() if n not in b)
    return appended, changed, removed


def _prefix(fp_doc: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The consumed prefix at ``step``; a document whose recipe cannot be read as one (a
    writer's stand-in, without sources) is its own prefix, so it matches only itself."""
    try:
        return prefix_document(dict(fp_doc), step)
    except (KeyError, TypeError, ValueError, AttributeError):
        return dict(fp_doc)


def _vouched(fp: str, doc: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``doc`` if it is the document of fingerprint ``fp`` (its SHA-256), else None: a
    document that does not hash to its fingerprint proves nothing about the recipe."""
    return doc if doc and fingerprint_of(dict(doc)) == fp else None


def same_consumed_prefix(fp_a: str, doc_a: Mapping[str, Any] | None, fp_b: str,
                         doc_b: Mapping[str, Any] | None, step: int) -> bool:
    """Do two recipes serve the same first ``step`` steps (same fingerprint, or the same
    consumed prefix at ``step``)? False when a document is missing to tell."""
    if fp_a == fp_b:
        return True
    doc_a, doc_b = _vouched(fp_a, doc_a), _vouched(fp_b, doc_b)
    if doc_a is None or doc_b is None:
        return False
    return fingerprint_of(_prefix(doc_a, step)) == fingerprint_of(_prefix(doc_b, step))


def amendment_between(earlier_step: int, earlier_fp: str,
                      earlier_doc: Mapping[str, Any] | None, later_step: int,
                      later_fp: str, later_doc: Mapping[str, Any] | None,
                      ) -> Amendment | None:
    """The recipe change between two consecutive checkpoints, None if there is none.

    The steps before ``earlier_step`` are proven unchanged when the consumed prefix at
    ``earlier_step`` of both fingerprint documents is the same; otherwise ``problem`` names
    the fields that differ (or says that a document is missing, so nothing can be proven)."""
    if earlier_fp == later_fp and (earlier_doc is None or later_doc is None
                                   or earlier_doc == later_doc):
        return None  # the same recipe (one checkpoint may just not carry its document)
    appended, changed, removed = _phase_diff(earlier_doc, later_doc)
    where = f"checkpoint {later_step} was written under another recipe than checkpoint " \
            f"{earlier_step}"
    early, late = _vouched(earlier_fp, earlier_doc), _vouched(later_fp, later_doc)
    if early is None or late is None:
        which, doc = ((earlier_step, earlier_doc) if early is None else (later_step, later_doc))
        lacks = ("carries no fingerprint document" if not doc else
                 "carries a fingerprint document that does not hash to its fingerprint")
        return Amendment(earlier_step, later_step, appended, changed, removed, None,
                         f"{where} (fingerprint {earlier_fp[:16]}... -> {later_fp[:16]}...), "
                         f"and checkpoint {which} {lacks}: the steps before {earlier_step} "
                         f"cannot be proven unchanged")
    old_prefix, new_prefix = _prefix(early, earlier_step), _prefix(late, earlier_step)
    old_fp, new_fp = fingerprint_of(old_prefix), fingerprint_of(new_prefix)
    if old_fp == new_fp:
        return Amendment(earlier_step, later_step, appended, changed, removed, old_fp, None)
    lines = phase_diff(old_prefix, new_prefix, earlier_step) or ["  (the documents differ)"]
    return Amendment(
        earlier_step, later_step, appended, changed, removed, None,
        f"{where}, and it changes what steps before {earlier_step} consumed (already served "
        f"and in the ledger): the consumed prefix has fingerprint {old_fp[:16]}... under "
        f"checkpoint {earlier_step}'s recipe, {new_fp[:16]}... under checkpoint "
        f"{later_step}'s; these fields differ:\n" + "\n".join(lines))


def check_consumed_prefix(saved_fp: str, saved_doc: Mapping[str, Any] | None, current_fp: str,
                          current_doc: Mapping[str, Any], step: int, what: str) -> None:
    """MismatchError unless a state saved at ``step`` under ``saved_fp`` may continue under
    the current recipe: the same fingerprint, or the same consumed prefix at ``step`` (the
    current recipe appended or changed phases that start at or after ``step``), as
    :func:`datalane.spec.fingerprint.check_fingerprint` decides with ``step``. Documents that
    do not hash to their fingerprints are compared whole (they prove no amendment)."""
    vouched = (_vouched(saved_fp, saved_doc) is not None
               and _vouched(current_fp, current_doc) is not None)
    check_fingerprint(saved_fp, dict(saved_doc) if saved_doc else None, current_fp,
                      dict(current_doc), what, step=step if vouched else None)

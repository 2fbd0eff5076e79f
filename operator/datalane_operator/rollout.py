"""Rolling an edited recipe into a running job: which pods serve an older recipe, and when the
operator restarts them.

A sidecar reads its recipe once, when it starts, so after an admitted edit of ``spec.recipe``
(an appended phase, say) the running pods go on serving the recipe they started with. Both
recipes serve the same data until the first step where they differ, ``P`` (the earliest start
of a phase appended, changed or removed). A checkpoint committed at a step ``C <= P`` may be
resumed under the new recipe; one committed at ``C > P`` by sidecars of the old recipe may
not (the sidecar refuses that resume, :func:`datalane.spec.phases.check_amend`). So the pods
must restart, all of them, after the job has committed its last checkpoint at or before ``P``
and before it commits one past ``P``.

What each pod serves is stamped on it by the pod webhook (:func:`stamp_of`, the annotation
``datalane.io/recipe``: the digest of the composed recipe it was injected with and, per
phase, its start and digest), so the difference is computed from the pods themselves, with
nothing kept in the operator's memory. :func:`plan_roll` decides, from the stamps, the
store's committed steps and the previous status:

* no pod serves an older recipe: nothing to do;
* the newest committed step ``L`` is past ``P``: too late - the checkpoint at ``L`` was
  written under the old recipe after ``P``, a resume under the new one is refused; the pods
  are left alone (restarting them would stop the job) and the condition says so (an edit
  cannot repair the stored recipe then: admission checks edits against it, not against the
  recipe the store's checkpoints were written under);
* the store not looked at yet (a new leader whose status was lost): wait for the look;
* no checkpoint committed yet: restart now (the job starts over under the new recipe, which
  is what admission promised for an edit before the first checkpoint);
* ``L`` was committed since the previous reconcile (a fresh checkpoint: the cheapest moment,
  the trainers lose only the steps since it), or the next checkpoint, expected at ``L + I``
  (``I`` the distance between the last two committed steps, or ``L`` with one), would come
  after ``P``: restart now;
* otherwise wait for the next checkpoint, saying so.

The guarantee: no checkpoint past ``P`` is committed by sidecars of the old recipe as long as
the operator sees each commit (every ``--storage-interval``) and its pod deletions take
effect before the job reaches its next checkpoint, i.e. the job's checkpoints are further
apart than a storage look plus a pod's termination. A job that checkpoints faster than that,
or an operator that was away, can miss ``P``: the condition then reads
``CheckpointPastPhase`` (and ``Degraded``), and the job keeps serving the old recipe.

Pods injected by an operator without stamps are never restarted; where the chart does not
let the operator delete pods, the reconciler turns the restart into ``RestartForbidden``
(:meth:`datalane_operator.reconcile.Decision.restart_refused`). Pure functions; the caller
is :func:`datalane_operator.reconcile.decide`, and :mod:`datalane_operator.reconciler` deletes
the pods it names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from datalane.spec.recipe import Recipe
from datalane_operator.names import ANN_RECIPE

__all__ = ["CONDITION", "Roll", "Stamp", "plan_roll", "stamp_of", "stamp_text"]

CONDITION = "PhaseRolled"
"""The status condition: True once every pod serves the current recipe."""
_NAMED = 3


def _digest(value: Any, size: int) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:size]


@dataclass(frozen=True)
class Stamp:
    """What a recipe is, for comparing the one a pod serves with the current one: the digest
    of the whole composed recipe, and each phase's (name, start step, digest)."""

    digest: str
    phases: tuple[tuple[str, int, str], ...] = ()

    def first_difference(self, other: Stamp) -> tuple[int, str] | None:
        """(step, phase name) where the two recipes first differ: the earliest start of a
        phase one has and the other lacks or defines otherwise. None when their phases are
        the same (what differs then, eval streams or an unused source, serves no training
        step differently)."""
        mine = {name: (start, d) for name, start, d in self.phases}
        theirs = {name: (start, d) for name, start, d in other.phases}
        starts = [(start, name) for name, (start, d) in mine.items() if theirs.get(name) != (
            start, d)]
        starts += [(start, name) for name, (start, d) in theirs.items() if mine.get(name) != (
            start, d)]
        return min(starts) if starts else None

    def to_text(self) -> str:
        return json.dumps({"digest": self.digest, "phases": [list(p) for p in self.phases]},
                          separators=(",", ":"))

    @classmethod
    def parse(cls, text: Any) -> Stamp | None:
        """The stamp of an annotation; None when absent or malformed (never restarted)."""
        try:
            doc = json.loads(str(text))
            phases = tuple((str(n), int(s), str(d)) for n, s, d in doc.get("phases") or [])
            return cls(str(doc["digest"]), phases)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def stamp_of(recipe: Recipe) -> Stamp:
    """The stamp of a composed recipe (its canonical form, as the sidecars get it)."""
    full = recipe.to_dict()
    phases = tuple((str(p["name"]), int(p["start_step"]), _digest(p, 12))
                   for p in full.get("phases") or [] if isinstance(p, dict))
    return Stamp(_digest(full, 16), phases)


def stamp_text(recipe: Recipe) -> str:
    """The value of the pod annotation ``datalane.io/recipe`` for ``recipe``."""
    return stamp_of(recipe).to_text()


@dataclass(frozen=True)
class Roll:
    """The decision: the ``PhaseRolled`` condition (status, reason, message; None: no
    condition, nothing was ever rolled), the pods to delete, and a problem for ``Degraded``."""

    condition: tuple[bool, str, str] | None = None
    restart: tuple[str, ...] = ()
    problem: tuple[str, str] | None = None


def _stale(pods: Sequence[Mapping[str, Any]], current: Stamp,
           ) -> list[tuple[str, tuple[int, str] | None]]:
    """(name, first difference) of each live pod stamped with another recipe (only the pod
    webhook stamps pods, when it injects the sidecar)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
                "Succeeded", "Failed"):
            continue
        stamp = Stamp.parse((meta.get("annotations") or {}).get(ANN_RECIPE))
        if stamp is not None and stamp.digest != current.digest:
            out.append((str(meta.get("name", "")), stamp.first_difference(current)))
    return sorted(out)


def _names(pods: Sequence[str]) -> str:
    more = len(pods) - _NAMED
    return ", ".join(pods[:_NAMED]) + (f" and {more} more" if more > 0 else "")


def plan_roll(current: Stamp, pods: Sequence[Mapping[str, Any]],
              committed: Sequence[int] | None, previous_step: int | None,
              previous: Mapping[str, Any] | None) -> Roll:
    """Whether to restart the pods serving an older recipe now (see the module docstring).

    ``committed``: the store's committed steps, ascending (the newest ones); None when the
    store has not been looked at yet (a new leader whose status was lost): then nothing is
    restarted until it has; ``previous_step``: ``status.lastCommittedStep`` of the previous
    reconcile; ``previous``: the previous ``PhaseRolled`` condition, if any."""
    stale = _stale(pods, current)
    if not stale:
        if not previous:
            return Roll()
        message = str(previous.get("message") or "")
        if previous.get("reason") == "RestartingPods":
            message = message.replace("restarting", "restarted", 1)
        elif previous.get("status") != "True":
            message = "every pod serves the current recipe"
        return Roll((True, "PodsCurrent", message))
    names = [name for name, _ in stale]
    diffs = [d for _, d in stale if d is not None]
    first = min(diffs) if diffs else None
    what = (f"phase {first[1]!r} (from step {first[0]})" if first
            else "the recipe (no phase differs)")
    who = f"{len(names)} pods serving an older recipe ({_names(names)})"
    if committed is None:
        return Roll((False, "WaitingForCheckpoint",
                     f"{who}: waiting for a look at the checkpoint store, to restart them at a "
                     f"checkpoint so that they resume under the recipe with {what}"))
    last = committed[-1] if committed else None
    if last is not None and first is not None and last > first[0]:
        text = (f"step {last} was committed by {who} after {what} began: a resume under the "
                f"current recipe is refused, so the pods were not restarted and keep the old "
                f"one; no edit can fix spec.recipe now (edits are checked against it): "
                f"recreate the DataPipeline with what changed starting at step {last} or later")
        return Roll((False, "CheckpointPastPhase", text),
                    problem=("CheckpointPastPhase", text))
    if last is None:
        return Roll((False, "RestartingPods",
                     f"restarting {who} before any checkpoint: the job starts over under the "
                     f"recipe with {what}"), tuple(names))
    interval = last - committed[-2] if len(committed) > 1 else last
    if last != previous_step:
        why = "the newest checkpoint"
    elif first is not None and last + interval > first[0]:
        why = (f"the newest checkpoint; the next, about step {last + interval}, would come "
               f"after step {first[0]}")
    else:
        return Roll((False, "WaitingForCheckpoint",
                     f"{who}: restarting them at the next checkpoint committed (the newest is "
                     f"step {last}), so that they resume under the recipe with {what}"))
    return Roll((False, "RestartingPods",
                 f"restarting {who} at step {last} ({why}): they resume there under the "
                 f"recipe with {what}"), tuple(names))

"""Edits of a running DataPipeline's recipe: which ones the validating webhook admits.

A run's recipe may change where the run has not been yet: phases that start after the
job's progress may be appended, changed or removed, and eval streams edited
(:func:`datalane.spec.phases.check_amend` decides, and names what an edit of the consumed
part changes). The progress is the newest checkpoint committed in the run's checkpoint store
(:class:`Progress`), read by the webhook from the store itself when the recipe changes: a
restarted job resumes there, so every step below it has been consumed for good. It is never
taken from the DataPipeline's status, which a user who may patch ``datapipelines/status``
can set to anything (``lastCommittedStep: null`` made the webhook admit an edit of a phase
that had started, and the resume under it was then refused: a wedged job). A store that
cannot be read refuses the edit, saying why. Without a committed checkpoint yet, any valid
edit is admitted (a restart serves the run from step 0 under the new recipe).

The sidecars read their recipe when they start, so an admitted edit reaches a pod when it
restarts: the operator restarts the pods at the job's next checkpoint, before the first
changed phase starts (:mod:`datalane_operator.rollout`); the warnings say so. Should the job
commit a checkpoint past that phase's start first, a resume that the edit does not fit is
refused by the sidecar with the same reason (its own check of the consumed prefix), never
served, and the operator leaves the pods alone.

Pure functions, no I/O. Caller: :func:`datalane_operator.admission.review_pipeline`, given
the progress by :mod:`datalane_operator.reconciler`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.phases import check_amend, phase_starts
from datalane.spec.recipe import Recipe

__all__ = ["Progress", "review_recipe_edit"]


@dataclass(frozen=True)
class Progress:
    """A run's progress as its checkpoint store says: the newest committed step (None: none
    yet) of the store at ``uri``, or ``error``, why the store could not be read."""

    uri: str
    step: int | None = None
    error: str | None = None

    def describe(self) -> str:
        return f"the newest checkpoint committed in {self.uri}, step {self.step}"


def _phases(recipe: Recipe) -> dict[str, tuple[int, Any]]:
    """Phase name -> (start step, its canonical form) of ``recipe``."""
    docs = {p.get("name"): p for p in recipe.to_dict().get("phases") or []
            if isinstance(p, dict)}
    return {name: (start, docs.get(name)) for name, start in phase_starts(recipe)}


def _edited_phases(old: Recipe, new: Recipe) -> list[tuple[str, str, int]]:
    """(verb, name, start step) of each phase the edit appends, changes or removes."""
    a, b = _phases(old), _phases(new)
    out = [("appended" if name not in a else "changed", name, start)
           for name, (start, body) in b.items() if name not in a or a[name][1] != body]
    out += [("removed", name, start) for name, (start, _) in a.items() if name not in b]
    return sorted(out, key=lambda x: (x[2], x[1]))


def review_recipe_edit(old: Recipe, new: Recipe, progress: Progress | None, *,
                       running: str | None = None) -> list[str]:
    """Check an UPDATE of ``spec.recipe`` against the job's ``progress``; returns warnings
    for the user, raises ConfigError naming what of the consumed part the edit changes, or
    why the progress is unknown (None: the store was not read). ``running`` names the
    workload when it exists (its pods serve the old recipe until they restart)."""
    if old == new:
        return []
    if progress is None or progress.error is not None:
        why = (progress.error if progress is not None and progress.error
               else "the checkpoint store was not read")
        where = f" {progress.uri}" if progress is not None else ""
        raise ConfigError(
            f"spec.recipe cannot be edited now: the run's progress, the newest checkpoint "
            f"committed in its store{where}, is unknown ({why}); an edit is checked against "
            f"the steps the run has consumed, so try again once the store can be read")
    step = progress.step
    if step is not None:
        try:
            check_amend(old, new, step)
        except MismatchError as e:
            detail = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()] or [str(e)]
            raise ConfigError(
                f"spec.recipe edits steps the run has already consumed "
                f"({progress.describe()}): {'; '.join(detail)}. Only phases that start at "
                f"step {step} or later, and eval streams, may change on a running "
                f"DataPipeline; create a new DataPipeline for a new run") from None
    if running is None:
        return []
    edited = _edited_phases(old, new)
    what = "; ".join(f"phase {name!r} (from step {start}) {verb}"
                     for verb, name, start in edited) or "the recipe changed"
    earliest = min((start for _, _, start in edited), default=None)
    before = f", before step {earliest}," if earliest is not None else ""
    if step is None:
        when = ("the operator restarts them now, and they start from step 0 under the new one "
                "(no checkpoint is committed yet)")
    else:
        when = (f"the operator restarts them when the job commits its next checkpoint (the "
                f"newest is step {step}){before} and they resume there under the new one")
    return [f"spec.recipe edited ({what}): the sidecars of {running} serve the recipe they "
            f"started with until their pods restart; {when}; kubectl describe dp shows the "
            f"condition PhaseRolled"]

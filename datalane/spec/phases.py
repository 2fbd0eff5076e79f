"""Mixture schedules: a recipe's phases, the weights in force at every step, and amendments.

A recipe's ``phases`` change the source weights during a run. Phase 0 is implicit: the
sources' own ``weight`` from step 0. Phase ``k`` starts at ``start_step`` and sets the weights
it names (the others keep the weights of phase ``k-1``: its *resulting weights*); with
``ramp_steps`` R the weights move linearly, from those in force at ``start_step - 1`` to the
resulting weights: at step ``start_step + j`` the fraction is ``min(1, (j + 1) / R)`` (R = 1,
the default, is a jump). :func:`weights_at` is the one definition; the mixture stage re-bases
at every change so that its choices stay exact (docs/recipe.md, Schedules and phases).

The weights up to step S depend only on the phases that start at or before S (a ramp runs
inside its own phase, never towards a later one). That is what makes appending phases to a
running recipe safe: a state saved at step S (S steps consumed) may be resumed with phases
starting at or after S added, changed or removed. :func:`prefix_document` is the part of a
fingerprint document those S steps depend on; :func:`check_amend` is the same rule at the
level of two recipes (for the operator's admission of an edited ``DataPipeline`` and the
ledger), and :func:`phase_starts` lists where each phase begins.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.model import doc
from datalane.spec.recipediff import diff_documents


class _Weighted(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...


class Recipe(Protocol):
    """What a schedule reads of a :class:`datalane.spec.recipe.Recipe` (which imports this
    module for :class:`Phase`; a protocol keeps the import one-way)."""

    @property
    def sources(self) -> Sequence[_Weighted]: ...

    @property
    def phases(self) -> Sequence[Phase]: ...

    def to_dict(self) -> dict[str, Any]: ...

__all__ = [
    "NAME_PATTERN",
    "Phase",
    "Schedule",
    "check_amend",
    "check_phases",
    "mean_weights",
    "phase_diff",
    "phase_starts",
    "prefix_document",
    "used_sources",
    "weights_at",
]

NAME_PATTERN = r"[a-z0-9]([a-z0-9_-]{0,62})?"
"""Names of phases, the same pattern as the names of sources (spec.recipe)."""


@dataclass(frozen=True)
class Phase:
    """A change of the source weights from a step on (piecewise constant, or a linear ramp)."""

    name: str = doc("Unique name of the phase (lowercase letters, digits, '-', '_').",
                    pattern=NAME_PATTERN)
    start_step: int = doc(
        "First step of the phase (>= 1; strictly increasing across phases).", ge=1)
    weights: dict[str, float] = doc(
        "Source name -> weight (>= 0) from this phase on; sources not named keep the weight "
        "of the phase before.", factory=dict)
    ramp_steps: int = doc(
        "Steps over which the weights move linearly from those in force at `start_step - 1` "
        "to this phase's: at step `start_step + k` the fraction is min(1, (k + 1) / "
        "ramp_steps); 1 is a jump.", default=1, ge=1)


@dataclass(frozen=True)
class _Segment:
    start: int
    origin: tuple[float, ...]  # the weights in force at start - 1
    target: tuple[float, ...]  # the phase's resulting weights
    ramp: int


@dataclass(frozen=True)
class Schedule:
    """The weights of every step, from the step-0 weights and the phases (in order)."""

    initial: tuple[float, ...]
    segments: tuple[_Segment, ...] = field(default=())

    @classmethod
    def build(cls, names: Sequence[str], weights: Sequence[float],
              phases: Sequence[tuple[int, Mapping[str, float], int]]) -> Schedule:
        """From source names and step-0 weights, and phases as ``(start, weights, ramp)``
        (already validated: known names, increasing starts)."""
        index = {n: i for i, n in enumerate(names)}
        schedule = cls(tuple(float(w) for w in weights))
        target = schedule.initial
        for start, changes, ramp in phases:
            origin = schedule.weights(start - 1)
            new = list(target)
            for name, w in changes.items():
                new[index[name]] = float(w)
            target = tuple(new)
            schedule = cls(schedule.initial,
                           (*schedule.segments, _Segment(start, origin, target, ramp)))
        return schedule

    @classmethod
    def of(cls, recipe: Recipe) -> Schedule:
        return cls.build([s.name for s in recipe.sources], [s.weight for s in recipe.sources],
                         [(p.start_step, p.weights, p.ramp_steps) for p in recipe.phases])

    @property
    def constant(self) -> bool:
        """No phase: the step-0 weights hold forever."""
        return not self.segments

    def weights(self, step: int) -> tuple[float, ...]:
        """The weights in force at ``step`` (see the module docstring for the formula)."""
        seg = None
        for s in self.segments:
            if s.start > step:
                break
            seg = s
        if seg is None:
            return self.initial
        k = step - seg.start + 1
        if k >= seg.ramp:
            return seg.target
        f = k / seg.ramp
        return tuple(o + (t - o) * f for o, t in zip(seg.origin, seg.target, strict=True))

    def used_before(self, step: int) -> list[bool]:
        """Per source: has its weight been positive at some step in ``0 .. max(step, 1) - 1``
        (the steps a state at ``step`` has consumed; the step-0 weights always count)?"""
        used = [w > 0 for w in self.initial]
        for s in self.segments:
            if s.start >= step:
                break
            # inside a phase the weights lie between origin and target, positive at its
            # first step wherever the target is (the fraction is > 0 from the first step)
            used = [u or t > 0 for u, t in zip(used, s.target, strict=True)]
        return used


def weights_at(recipe: Recipe, step: int) -> tuple[float, ...]:
    """The source weights in force at ``step`` (one per source, in ``sources`` order)."""
    return Schedule.of(recipe).weights(step)


def phase_starts(recipe: Recipe) -> list[tuple[str, int]]:
    """``(name, start_step)`` of each phase, in order (phase 0, the sources' weights, is
    implicit at step 0 and not listed)."""
    return [(p.name, p.start_step) for p in recipe.phases]


def used_sources(recipe: Recipe, step: int) -> list[bool]:
    """Per source: has it had a positive weight at some step a state at ``step`` consumed
    (``0 .. step - 1``; the step-0 weights always count)?"""
    return Schedule.of(recipe).used_before(step)


def mean_weights(recipe: Recipe, steps: int) -> tuple[float, ...]:
    """The shares the schedule asks for over steps ``0 .. steps - 1``: each step's weights
    normalized, averaged over the steps (the cumulative shares a run of steps of equal tokens
    tracks); for a recipe without phases simply the source weights."""
    schedule = Schedule.of(recipe)
    if schedule.constant or steps <= 0:
        return schedule.initial
    total = [0.0] * len(schedule.initial)
    for step in range(steps):
        w = schedule.weights(step)
        norm = sum(w)
        total = [t + x / norm for t, x in zip(total, w, strict=True)]
    return tuple(t / steps for t in total)


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _show(weights: Sequence[float], names: Sequence[str]) -> str:
    return ", ".join(f"{n} {w:g}" for n, w in zip(names, weights, strict=True))


def check_phases(recipe: Recipe, where: str) -> None:
    """ConfigError unless the recipe's weights and phases make a schedule: every phase's name
    unique, its start after the previous one's, its weights naming sources with weights >= 0,
    and the step-0 weights and every phase's resulting weights with a positive sum."""
    names = [s.name for s in recipe.sources]
    initial = [s.weight for s in recipe.sources]
    if not sum(initial) > 0:
        raise ConfigError(
            f"{_at(where, 'sources')}: every source has weight 0 at step 0 "
            f"({_show(initial, names)}); at least one needs a positive weight")
    known = set(names)
    seen: dict[str, int] = {}
    target = list(initial)
    for i, p in enumerate(recipe.phases):
        at = _at(where, f"phases[{i}]")
        if p.name in seen:
            raise ConfigError(f"{at}.name {p.name!r} is used by phases[{seen[p.name]}]; "
                              f"phase names must be unique")
        seen[p.name] = i
        if i and p.start_step <= recipe.phases[i - 1].start_step:
            before = recipe.phases[i - 1]
            raise ConfigError(
                f"{at} {p.name!r} starts at step {p.start_step}, not after phases[{i - 1}] "
                f"{before.name!r} at step {before.start_step}; start steps must increase")
        for name, w in p.weights.items():
            if name not in known:
                raise ConfigError(f"{at}.weights names {name!r}, which is not a source; the "
                                  f"sources are {', '.join(names)}")
            if not w >= 0:
                raise ConfigError(f"{at}.weights.{name} {w!r} must be >= 0")
            target[names.index(name)] = w
        if not sum(target) > 0:
            raise ConfigError(f"{at} {p.name!r} leaves every source at weight 0 "
                              f"({_show(target, names)}); at least one needs a positive weight")


# -- the consumed prefix of a fingerprint document --------------------------------------------

def _schedule_of_document(recipe: Mapping[str, Any]) -> Schedule:
    sources = recipe["sources"]
    return Schedule.build([s["name"] for s in sources], [s["weight"] for s in sources],
                          [(p["start_step"], p["weights"], p.get("ramp_steps", 1))
                           for p in recipe.get("phases", [])])


def prefix_document(document: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The part of a fingerprint document that the first ``step`` steps depend on.

    Drops the phases that start at or after ``step``, the sources that had weight 0 at every
    step before ``step`` (the step-0 weights always count) with their files and document
    identities, and the recipe's ``eval`` streams (which never affect training). When a
    dropped source comes before a kept one, ``source_index`` records the index of every kept
    one (lane states hold sources by index). For a recipe without phases whose sources all
    have a positive weight the prefix is the document itself, so states saved before phases
    existed still match.
    """
    out = copy.deepcopy(dict(document))
    out.pop("eval", None)
    recipe = out.get("recipe")
    if not isinstance(recipe, dict):
        return out
    recipe.pop("eval", None)
    if "phases" in recipe:
        kept = [p for p in recipe["phases"] if p["start_step"] < step]
        if kept:
            recipe["phases"] = kept
        else:
            del recipe["phases"]
    sources = recipe.get("sources", [])
    used = _schedule_of_document(recipe).used_before(step)
    if all(used):
        return out
    dropped = {s["name"] for s, u in zip(sources, used, strict=True) if not u}
    index = {s["name"]: i for i, (s, u) in enumerate(zip(sources, used, strict=True)) if u}
    if list(index.values()) != list(range(len(index))):  # an unused source before a used one
        out["source_index"] = index
    recipe["sources"] = [s for s in sources if s["name"] not in dropped]
    for p in recipe.get("phases", []):  # a kept phase may name a dropped source (weight 0)
        p["weights"] = {k: v for k, v in p["weights"].items() if k not in dropped}
    for key in ("files", "documents", "compressed_chunks"):
        if isinstance(out.get(key), dict):
            out[key] = {k: v for k, v in out[key].items() if k not in dropped}
            if key != "files" and not out[key]:
                del out[key]
    return out


def _phase_label(i: int, p: Mapping[str, Any], step: int) -> str:
    return (f"phases[{i}] {p.get('name')!r} (starts at step {p.get('start_step')}, before the "
            f"resume step {step})")


def phase_diff(saved: Mapping[str, Any], current: Mapping[str, Any], step: int,
               limit: int = 12) -> list[str]:
    """Human lines naming what differs between two consumed prefixes (of the same ``step``):
    per phase (which phase, where it starts, which field), then every other field."""
    a, b = copy.deepcopy(dict(saved)), copy.deepcopy(dict(current))
    pa = a.get("recipe", {}).pop("phases", []) if isinstance(a.get("recipe"), dict) else []
    pb = b.get("recipe", {}).pop("phases", []) if isinstance(b.get("recipe"), dict) else []
    lines: list[str] = []
    for i in range(max(len(pa), len(pb))):
        if i >= len(pb):
            lines.append(f"  {_phase_label(i, pa[i], step)}: removed")
            continue
        if i >= len(pa):
            lines.append(f"  {_phase_label(i, pb[i], step)}: added")
            continue
        old, new = pa[i], pb[i]
        for key in sorted(set(old) | set(new)):
            if key == "weights":
                continue
            if old.get(key) != new.get(key):
                lines.append(f"  {_phase_label(i, old, step)}: {key} saved "
                             f"{old.get(key, '<absent>')!r}, now {new.get(key, '<absent>')!r}")
        wo, wn = old.get("weights", {}), new.get("weights", {})
        for name in sorted(set(wo) | set(wn)):
            if wo.get(name) != wn.get(name):
                lines.append(f"  {_phase_label(i, old, step)}: weights.{name} saved "
                             f"{wo.get(name, '<absent>')!r}, now {wn.get(name, '<absent>')!r}")
    # every field line, cut once below: a list the diff had cut already would be counted as
    # its shown lines and one "... and N more" line, not as the lines it stands for
    lines.extend(_named_sources(diff_documents(a, b, limit=sys.maxsize), a, b))
    if len(lines) > limit:
        lines = [*lines[:limit], f"  ... and {len(lines) - limit} more"]
    return lines


def _named_sources(lines: list[str], a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``recipe.sources[i]`` in diff lines, followed by the source's name where both sides
    agree on it (a prefix's list indices skip the dropped sources)."""
    import re

    def names(d: Mapping[str, Any]) -> list[str]:
        recipe = d.get("recipe")
        return [s.get("name") for s in recipe.get("sources", [])] if isinstance(
            recipe, dict) else []

    na, nb = names(a), names(b)

    def label(m: re.Match[str]) -> str:
        i = int(m.group(1))
        name = na[i] if i < len(na) else None
        if name is None or (i < len(nb) and nb[i] != name):
            return m.group(0)
        return f"{m.group(0)} {name!r}"

    return [re.sub(r"recipe\.sources\[(\d+)\]", label, line, count=1) for line in lines]


def check_amend(old: Recipe, new: Recipe, step: int) -> None:
    """MismatchError unless ``new`` may continue a run of ``old`` that has consumed ``step``
    steps: the same recipe up to that step (phases starting at or after ``step`` and sources
    unused until then may differ; new sources must come after the existing ones). The message
    names each phase, source and field of the consumed part that differs. Recipe-level: the
    identity of the files is not compared (a restore compares that too)."""
    if step < 0:
        raise ConfigError(f"step must be >= 0, got {step}")
    a = prefix_document({"recipe": old.to_dict()}, step)
    b = prefix_document({"recipe": new.to_dict()}, step)
    a_index = a.pop("source_index", None) or {s.name: i for i, s in enumerate(old.sources)}
    b_index = b.pop("source_index", None) or {s.name: i for i, s in enumerate(new.sources)}
    lines = phase_diff(a, b, step)
    moved = [f"  sources {n!r}: at sources[{i}] before, now sources[{b_index[n]}]"
             for n, i in a_index.items() if n in b_index and b_index[n] != i]
    lines.extend(moved)
    if len(new.sources) < len(old.sources):
        lines.append(f"  sources: {len(old.sources)} before, now {len(new.sources)}; a source "
                     f"may be added after the others, never removed")
    if lines:
        raise MismatchError(
            f"the recipe cannot continue a run at step {step}: the part already consumed "
            f"differs (phases starting at or after step {step} may change freely):\n"
            + "\n".join(lines))

"""Checks of a lane's resume point against the plan, before a lane restores from it.

A sealed state (docs/checkpoint-format.md) proves that nobody changed it after it was
written, not that it makes sense for this recipe: a state edited by hand and sealed again, or
written by a faulty writer, could name a block far past the records the lane has read, or
mark a lane that still has data as ended. The lane would then serve other data than the run
it claims to continue, without an error. :func:`check_lane_state` refuses such a state with a
MismatchError naming the lane, the field and the value. It reads no data; it checks what the
plan and the state's own numbers bound:

* the source cursors and mixture counters: one per source of the recipe (fewer only for
  sources a phase added later, unused so far), a source with weight 0 so far never read;
* each cursor: inside the lane's chunks of its epoch, its offset inside a block; for a source
  of finite ``epochs`` at most that epoch, and exactly the exhausted cursor there; the block
  and offset within the records the lane has read (block ``b`` of ``K`` records starts after
  ``b * K`` records of the source's epoch, each counted in ``n.docs``);
* the counters: every sequence holds ``seq_len + 1`` tokens, document tokens or padding
  (``n.tokens + n.padding``); documents kept and skipped are among those read;
* the end flag (``end``): only when every source of positive weight (at step 0, or in a
  phase begun before the state's step) has run out and the packer holds nothing.

The packer checks its own carry-over against the recipe (:mod:`datalane.engine.packers`), and
a carried document is re-read by its reference when the lane opens. Caller:
:class:`datalane.engine.lane.LaneStream`.
"""

from __future__ import annotations

from typing import Any

from datalane.engine.plan import Plan, SourcePlan
from datalane.spec.errors import MismatchError
from datalane.spec.phases import Schedule
from datalane.spec.state import LaneState, SourceCursor

__all__ = ["FRESH", "check_lane_state"]

FRESH = SourceCursor(0, 0, 0, -1, 0)
"""The cursor of a source before its first record."""


def check_lane_state(plan: Plan, lane: int, state: LaneState, schedule: Schedule) -> None:
    """Refuse a state that lane ``lane`` of ``plan`` could never have written."""
    recipe = plan.recipe
    where = f"lane {lane} state"
    if state.lane != lane:
        raise MismatchError(f"the state of lane {state.lane} cannot restore lane {lane}")
    step = state.sequences // recipe.lane_batch
    used = schedule.used_before(step)
    for what, n in (("source cursors", len(state.sources)),
                    ("mixture counters", len(state.mixture))):
        # sources added after the others, unused so far, start fresh (an appended phase)
        if n != len(recipe.sources) and not (n < len(recipe.sources) and not any(used[n:])):
            raise MismatchError(f"{where} has {n} {what}; the recipe has "
                                f"{len(recipe.sources)} sources")
    if len(state.sources) != len(state.mixture):
        raise MismatchError(f"{where} has {len(state.sources)} source cursors but "
                            f"{len(state.mixture)} mixture counters")
    for i, (c, consumed) in enumerate(zip(state.sources, state.mixture, strict=True)):
        if not used[i] and (c != FRESH or consumed):
            raise MismatchError(
                f"{where}: source {i} {recipe.sources[i].name!r} has weight 0 before step "
                f"{step}, but the state has read from it (cursor {c.encode()}, {consumed} "
                f"tokens)")
    for i, c in enumerate(state.sources):
        _check_cursor(plan.sources[i], lane, c, state, recipe.shuffle.block_size, where)
    if state.sequences % recipe.lane_batch:
        raise MismatchError(f"{where} is {state.sequences} sequences in, not on a step "
                            f"boundary of {recipe.lane_batch} sequences")
    _check_counters(state, recipe.sequence_tokens, where)
    if state.ended:
        _check_end(plan, state, schedule, where)


def _check_cursor(source: SourcePlan, lane: int, c: SourceCursor, state: LaneState,
                  block_size: int, where: str) -> None:
    chunks = source.lane_chunks(lane, c.epoch) if c.epoch >= 0 else []
    if min(c.epoch, c.block, c.chunk, c.offset, c.pos + 1) < 0 or (
            c.chunk and c.chunk >= len(chunks)) or c.offset >= block_size:
        raise MismatchError(f"{where}: cursor {c.encode()} of source {source.index} points "
                            f"outside the source")
    name = f"{where}: source {source.index} {source.source.name!r} cursor {c.encode()}"
    epochs = source.source.epochs
    if epochs is not None and c.epoch > epochs:
        raise MismatchError(f"{name}: epoch {c.epoch} lies past the source's {epochs} "
                            f"epochs (recipe sources[{source.index}].epochs)")
    if epochs is not None and c.epoch == epochs and c != SourceCursor(epochs, 0, 0, -1, 0):
        raise MismatchError(f"{name}: epoch {epochs} means the source is exhausted, whose "
                            f"cursor is {SourceCursor(epochs, 0, 0, -1, 0).encode()}")
    before = c.block * block_size + c.offset
    if before > state.counters.docs:
        raise MismatchError(
            f"{name}: block {c.block} of {block_size} records, {c.offset} of it consumed, "
            f"lies past the {state.counters.docs} records the lane has read (n.docs); "
            f"the lane's blocks of epoch {c.epoch} before it hold {before} records")


def _check_counters(state: LaneState, sequence_tokens: int, where: str) -> None:
    n = state.counters
    held = state.sequences * sequence_tokens
    if n.tokens + n.padding != held:
        raise MismatchError(
            f"{where}: n.tokens {n.tokens} + n.padding {n.padding} = {n.tokens + n.padding} "
            f"tokens, but its {state.sequences} sequences of {sequence_tokens} tokens hold "
            f"{held}")
    skipped = sum(n.skipped.values())
    if n.kept + skipped > n.docs:
        raise MismatchError(f"{where}: n.kept {n.kept} + skipped {skipped} documents are more "
                            f"than the {n.docs} records it has read (n.docs)")


def _check_end(plan: Plan, state: LaneState, schedule: Schedule, where: str) -> None:
    """A lane ends when every source of positive weight has run out: under the weights of
    step 0 or of a phase begun before the state's step (the zeros of a ramp's weights are
    zeros of its target too), and then its packer is flushed."""
    step = state.sequences // plan.recipe.lane_batch
    regimes = [schedule.initial, *(s.target for s in schedule.segments if s.start < step)]

    def left(i: int) -> str | None:
        """Why source ``i`` has not run out (None: it has)."""
        epochs = plan.sources[i].source.epochs
        if i >= len(state.sources):
            return "it has not been read at all"
        c = state.sources[i]
        if epochs is None:
            return f"cursor {c.encode()}, and it repeats forever (epochs null)"
        return None if c.epoch >= epochs else f"cursor {c.encode()}, epoch {c.epoch} of {epochs}"

    live = []
    for weights in regimes:
        live = [(i, w, why) for i, w in enumerate(weights) if w > 0
                for why in [left(i)] if why is not None]
        if not live:
            break
    if live:
        i, w, why = live[0]
        raise MismatchError(f"{where} is marked ended (end: 1), but source {i} "
                            f"{plan.sources[i].source.name!r} (weight {w:g}) has not run out: "
                            f"{why}")
    if _holds(state.packer.data):
        raise MismatchError(f"{where} is marked ended (end: 1), but its packer still holds "
                            f"a carry-over ({_short(state.packer.data)}); a lane ends only "
                            f"once its packer is flushed")


def _holds(value: Any) -> bool:
    """Whether a packer's state holds any piece (lists and objects of nothing hold none)."""
    if isinstance(value, dict):
        return any(_holds(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v) for v in value)
    return value is not None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

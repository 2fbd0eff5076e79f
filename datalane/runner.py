"""Run every rank of a world in one process and compose global step hashes.

Used by the ``datalane run`` and ``datalane verify`` commands and by tests: all ranks share
one plan and one worker pool, so a world of 8 ranks costs what one rank with every lane
costs. :func:`run_world` returns the global hash of each step, the checkpoints asked for and
the merged counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from datalane.engine.loader import Loader, Step
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import ConfigError
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import check_world_size
from datalane.spec.recipe import Recipe
from datalane.spec.state import Checkpoint, Counters, merge_checkpoints

__all__ = ["WorldRun", "run_world"]


@dataclass
class WorldRun:
    """What one run of a world produced."""

    hashes: dict[int, str] = field(default_factory=dict)  # step -> global hash
    checkpoints: dict[int, Checkpoint] = field(default_factory=dict)  # step -> merged state
    counters: Counters = field(default_factory=Counters)
    mixture: list[int] = field(default_factory=list)  # tokens taken from each source so far
    seconds: float = 0.0
    ended: bool = False  # the run stopped because every lane ran out of data


def run_world(recipe: Recipe, world_size: int, knobs: Knobs, steps: int | None,
              *, plan: Plan | None = None, start: Checkpoint | None = None,
              save_at: frozenset[int] = frozenset(),
              on_step: Callable[[int, str], None] | None = None,
              on_rank_step: Callable[[int, Step], None] | None = None) -> WorldRun:
    """Run ``steps`` steps (None: until every lane has ended) on ``world_size`` ranks;
    ``on_step(step, global hash)`` after each step, ``on_rank_step(rank, step)`` with each
    rank's local batch of it (``datalane verify`` counts documents and images there)."""
    check_world_size(recipe.lanes, world_size)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps < 1):
        raise ConfigError(f"steps must be a positive integer or None (until the data ends), "
                          f"got {steps!r}")
    plan = plan or Plan.build(recipe)
    out = WorldRun()
    with TaskPool.of(knobs) as pool:
        loaders = [Loader(recipe, r, world_size, knobs, plan=plan, pool=pool)
                   for r in range(world_size)]
        try:
            if start is not None:
                for loader in loaders:
                    loader.load_state_dict(start)
            step = loaders[0].step
            end = None if steps is None else step + steps
            t0 = time.perf_counter()
            while end is None or step < end:
                if step in save_at:
                    out.checkpoints[step] = merge_checkpoints(
                        Checkpoint.from_json(ld.state_dict()) for ld in loaders)
                results = [ld.next_step() for ld in loaders]
                digests: dict[int, bytes] = {}
                for res in results:
                    digests.update(res.lane_digests)
                if steps is None and all(r.ended for r in results) and _all_padding(results):
                    out.ended = True
                    break
                out.hashes[step] = global_hash(digests[k] for k in sorted(digests))
                if on_rank_step is not None:
                    for rank, res in enumerate(results):
                        on_rank_step(rank, res)
                if on_step is not None:
                    on_step(step, out.hashes[step])
                step += 1
                if steps is None and all(r.ended for r in results):
                    out.ended = True
                    break
            if step in save_at:
                out.checkpoints[step] = merge_checkpoints(
                    Checkpoint.from_json(ld.state_dict()) for ld in loaders)
            out.seconds = time.perf_counter() - t0
            out.mixture = [0] * len(recipe.sources)
            for ld in loaders:
                out.counters.add(ld.counters())
                out.mixture = [a + b for a, b in zip(out.mixture, ld.mixture_tokens(),
                                                     strict=True)]
        finally:
            for ld in loaders:
                ld.close()
    return out


def _all_padding(results: list[Step]) -> bool:
    return all(bool((r.positions < 0).all()) for r in results)

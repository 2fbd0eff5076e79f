"""``datalane verify``: the same batches for every world size, worker count and resume point.

For each ``(world, workers)`` pair the recipe runs uninterrupted; with ``map_processes`` N > 0,
once more on the first world with its map stages in N child processes (the knob of
:mod:`datalane.engine.mapprocs`: the recipe's predicates and templates there); then, for each
resume step, the state saved by one pair is resumed on the *next* pair in the list (another
world size and worker count). Every step hash is compared with the first uninterrupted run,
and so is what each step holds counted from the batches: document starts (position 0 in a used
row) and, for a vision recipe, images (rows of ``image_grid_thw``); each run's line gives its
totals.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from datalane.engine.loader import Step
from datalane.engine.plan import Plan
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import check_world_size
from datalane.spec.recipe import load_recipe

__all__ = ["verify"]


@dataclass
class _Row:
    label: str
    steps: int
    agree: int
    first_bad: int | None
    documents: int = 0
    images: int = 0


class _Tally:
    """Documents and images per step, counted from every rank's batches."""

    def __init__(self) -> None:
        self.documents: Counter[int] = Counter()
        self.images: Counter[int] = Counter()

    def __call__(self, rank: int, step: Step) -> None:
        positions = step.columns["positions"]
        self.documents[step.step] += int((positions == 0).sum())
        grid = step.columns.get("image_grid_thw")
        self.images[step.step] += 0 if grid is None else len(grid)

    def of(self, step: int) -> tuple[int, int]:
        return self.documents[step], self.images[step]


def verify(recipe_path: str, steps: int, worlds: list[int], workers: list[int],
           resume_at: list[int], prefetch: int = 8, map_processes: int = 0) -> bool:
    Knobs(map_processes=map_processes)  # refused here, naming it, before any run
    recipe = load_recipe(recipe_path)
    for w in worlds:
        check_world_size(recipe.lanes, w)
    bad_resume = [r for r in resume_at if not 0 <= r < steps]
    if bad_resume:
        from datalane.spec.errors import ConfigError

        raise ConfigError(f"--resume-at {bad_resume} must lie in 0..{steps - 1}")
    plan = Plan.build(recipe)
    combos = list(itertools.product(worlds, workers))
    rows: list[_Row] = []
    reference: dict[int, str] | None = None
    counts = _Tally()
    saved = {}
    for w, k in combos:
        tally = _Tally()
        run = run_world(recipe, w, Knobs(workers=k, prefetch=prefetch), steps, plan=plan,
                        save_at=frozenset(resume_at), on_rank_step=tally)
        if reference is None:
            reference, counts = run.hashes, tally
        saved[(w, k)] = run.checkpoints
        rows.append(_compare(f"world={w} workers={k}", run.hashes, reference, tally, counts))
        print(_line(rows[-1]), flush=True)
    assert reference is not None
    if map_processes > 0:
        w = worlds[0]
        tally = _Tally()
        run = run_world(recipe, w, Knobs(map_processes=map_processes, prefetch=prefetch),
                        steps, plan=plan, on_rank_step=tally)
        rows.append(_compare(f"world={w} map_processes={map_processes}", run.hashes,
                             reference, tally, counts))
        print(_line(rows[-1]), flush=True)
    for r in resume_at:
        for i, (w, k) in enumerate(combos):
            w2, k2 = combos[(i + 1) % len(combos)]
            if (w2, k2) == (w, k) and len(worlds) > 1:
                w2 = worlds[(worlds.index(w) + 1) % len(worlds)]
            tally = _Tally()
            run = run_world(recipe, w2, Knobs(workers=k2, prefetch=prefetch), steps - r,
                            plan=plan, start=saved[(w, k)][r], on_rank_step=tally)
            rows.append(_compare(f"world={w} workers={k} -> resume@{r} on world={w2} "
                                 f"workers={k2}", run.hashes, reference, tally, counts))
            print(_line(rows[-1]), flush=True)
    ok = all(row.first_bad is None for row in rows)
    total = sum(row.steps for row in rows)
    print(f"{'OK' if ok else 'MISMATCH'}: {len(rows)} runs, {total} step hashes compared "
          f"against world={combos[0][0]} workers={combos[0][1]}")
    return ok


def _compare(label: str, hashes: dict[int, str], reference: dict[int, str], tally: _Tally,
             counts: _Tally) -> _Row:
    agree = 0
    first_bad = None
    for step, h in sorted(hashes.items()):
        if reference.get(step) == h and tally.of(step) == counts.of(step):
            agree += 1
        elif first_bad is None:
            first_bad = step
    if len(hashes) == 0 and reference:
        first_bad = min(reference)
    return _Row(label, len(hashes), agree, first_bad, sum(tally.documents.values()),
                sum(tally.images.values()))


def _line(row: _Row) -> str:
    verdict = "ok" if row.first_bad is None else f"DIFFERS from step {row.first_bad}"
    return (f"{row.label:<58} {row.agree:>5}/{row.steps:<5} {verdict:<22} "
            f"documents {row.documents:>7} images {row.images:>7}")

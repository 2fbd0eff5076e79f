"""One harness, every stateful stage: resuming anywhere equals the uninterrupted run.

``assert_resume_anywhere`` runs a stage uninterrupted, then for each resume point runs a fresh
stage to that point, saves its state through JSON, builds a third stage from the state alone
and checks that everything it produces from there is identical. It is applied to the document
stream (block shuffle + map stages), the mixture, both packers (wrap, bestfit) at sequence
granularity, the lane (step windows) and the loader (``state_dict``), across block, chunk,
epoch and source-exhaustion boundaries and past the end of the data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from datalane.engine.docstream import DocStream
from datalane.engine.lane import LaneStream
from datalane.engine.loader import Loader
from datalane.engine.mapstage import MapStage
from datalane.engine.mixture import Mixture
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.knobs import Knobs
from datalane.spec.state import Counters, LaneState, SourceCursor


def assert_resume_anywhere(make: Callable[[Any], Any], advance: Callable[[Any], Any],
                           save: Callable[[Any], Any], total: int,
                           points: list[int] | None = None) -> None:
    """``make(None)`` starts fresh, ``make(state)`` restores; outputs must match after any k."""
    reference = make(None)
    expected = [advance(reference) for _ in range(total)]
    for k in points if points is not None else range(total + 1):
        first = make(None)
        for _ in range(k):
            advance(first)
        state = json.loads(json.dumps(save(first)))  # only what survives serialization
        resumed = make(state)
        got = [advance(resumed) for _ in range(total - k)]
        assert got == expected[k:], f"resuming at {k} diverged"


@pytest.fixture
def pool() -> Iterator[TaskPool]:
    with TaskPool(3) as p:
        yield p


def _stages(plan: Plan) -> list[MapStage]:
    return plan.map_stages()


KNOBS = Knobs(workers=3, prefetch=2, task_docs=5)


def test_doc_stream_resumes_anywhere(make_recipe, pool) -> None:
    # web: 2 epochs of ~75 documents for lane 3, blocks of 16, chunks of 50 rows
    plan = Plan.build(make_recipe(sources=[
        {"name": "web", "uris": [make_recipe().sources[0].uris[0]], "epochs": 2,
         "chunk_rows": 50}]))
    stage = _stages(plan)[0]

    def make(state: Any) -> DocStream:
        cursor = SourceCursor.decode(state, "cursor") if state is not None else None
        return DocStream(plan.sources[0], 3, stage, pool, KNOBS, 16, "skip", Counters(), cursor)

    def advance(s: DocStream) -> Any:
        got = s.next_doc()
        return None if got is None else (got.columns[0].tobytes(), got.ref)

    total = 0
    probe = make(None)
    while probe.next_doc() is not None:
        total += 1
    assert 120 < total < 260
    assert_resume_anywhere(make, advance, lambda s: s.cursor.encode(), total + 2,
                           points=[*range(0, total + 3, 7), 15, 16, 17, total - 1, total])


def test_mixture_resumes_anywhere(make_recipe, pool) -> None:
    plan = Plan.build(make_recipe())
    stages = _stages(plan)

    def make(state: Any) -> Mixture:
        cursors = state["cursors"] if state else [None, None]
        streams = [DocStream(sp, 5, stages[sp.index], pool, KNOBS, 16, "skip", Counters(),
                             SourceCursor.decode(c, "c") if c else None)
                   for sp, c in zip(plan.sources, cursors, strict=True)]
        return Mixture(streams, [0.7, 0.3], state["consumed"] if state else None)

    def advance(m: Mixture) -> Any:
        got = m.next_doc()
        return None if got is None else (got.source, got.ref, got.columns[0].tobytes())

    def save(m: Mixture) -> Any:
        return {"cursors": [s.cursor.encode() for s in m.streams], "consumed": m.consumed}

    assert_resume_anywhere(make, advance, save, 110, points=list(range(0, 111, 9)))


@pytest.mark.parametrize("packing", [{"algorithm": "wrap"},
                                     {"algorithm": "bestfit", "bestfit_bins": 3}])
def test_packers_resume_after_any_sequence(make_recipe, pool, packing) -> None:
    # global batch == lanes: a window is one sequence, so the lane state is the packer state
    plan = Plan.build(make_recipe(global_batch_size=8, packing=packing))
    stages = _stages(plan)

    def make(state: Any) -> LaneStream:
        return LaneStream(plan, 2, stages, pool, KNOBS,
                          LaneState.from_json(state) if state else None)

    def advance(lane: LaneStream) -> Any:
        w = lane.next_window()
        return w.input_ids.tobytes(), w.positions.tobytes(), w.ended

    probe = make(None)
    n = 0
    while not probe.next_window().ended:
        n += 1
    assert n > 40  # the lane runs past both sources' ends inside the test
    points = sorted({*range(0, n + 4, 5), *range(n - 3, n + 4)})
    assert_resume_anywhere(make, advance, lambda lane: lane.state().to_json(), n + 3, points)


def test_lane_windows_and_counters_resume(make_recipe, pool) -> None:
    plan = Plan.build(make_recipe())
    stages = _stages(plan)

    def make(state: Any) -> LaneStream:
        return LaneStream(plan, 7, stages, pool, KNOBS,
                          LaneState.from_json(state) if state else None)

    def advance(lane: LaneStream) -> Any:
        w = lane.next_window()
        c = lane.counters
        return w.digest, w.ended, (c.docs, c.kept, c.tokens, c.padding, dict(c.skipped))

    assert_resume_anywhere(make, advance, lambda lane: lane.state().to_json(), 30)


def test_loader_state_dict_resumes(make_recipe) -> None:
    recipe = make_recipe(sources=[
        {"name": "web", "uris": [make_recipe().sources[0].uris[0]], "epochs": None,
         "chunk_rows": 40}])
    plan = Plan.build(recipe)

    def make(state: Any) -> Loader:
        loader = Loader(recipe, 1, 2, Knobs(workers=2), plan=plan)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    def advance(loader: Loader) -> Any:
        step = loader.next_step()
        return step.step, step.input_ids.tobytes(), step.positions.tobytes()

    assert_resume_anywhere(make, advance, lambda ld: ld.state_dict(), 25,
                           points=[0, 1, 2, 5, 11, 24, 25])


def test_no_drain_checkpointing_every_step_changes_nothing(make_recipe) -> None:
    """A run saved and restored at every step is byte-identical to a run never saved."""
    recipe = make_recipe()
    plan = Plan.build(recipe)
    with Loader(recipe, 0, 1, Knobs(workers=2), plan=plan) as loader:
        plain = [loader.next_step() for _ in range(40)]
    chained = []
    state = None
    for _ in range(40):
        with Loader(recipe, 0, 1, Knobs(workers=1), plan=plan) as loader:
            if state is not None:
                loader.load_state_dict(state)
            chained.append(loader.next_step())
            state = json.loads(json.dumps(loader.state_dict()))
    for a, b in zip(plain, chained, strict=True):
        assert a.step == b.step
        assert np.array_equal(a.input_ids, b.input_ids)
        assert np.array_equal(a.positions, b.positions)

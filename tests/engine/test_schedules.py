"""Mixture schedules and phases through the whole engine: resume anywhere, any world size,
phases appended to a running recipe, new sources for a later phase.

The stage tests (tests/engine/test_mixture_schedule.py) prove the mixture's arithmetic; here
the recipes are real (the test corpus: web Parquet and code JSONL) and runs go through
:func:`datalane.runner.run_world`, whose global step hashes are the proof of identity.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datalane.corpus import DemoCorpus
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.runner import run_world
from datalane.spec.errors import MismatchError
from datalane.spec.knobs import Knobs
from datalane.spec.phases import prefix_document
from datalane.spec.recipe import Recipe, load_recipe
from datalane.spec.state import Checkpoint
from tests.conftest import base_recipe_dict
from tests.support import paths

STEPS = 10
GOLDEN = str(paths.GOLDEN)


def recipe(corpus: DemoCorpus, phases: list[dict[str, Any]] | None = None,
           extra: list[dict[str, Any]] | None = None, **over: Any) -> Recipe:
    data = base_recipe_dict(corpus, **over)
    for s in data["sources"]:
        s["epochs"] = None  # no source runs out within the test
    data["sources"] += extra or []
    if phases is not None:
        data["phases"] = phases
    return load_recipe(data)


def consumed_per_step(r: Recipe, steps: int) -> list[list[int]]:
    """Tokens each source has fed lane 0 after each step (from its lane state)."""
    loader = Loader(r, 0, r.lanes, Knobs(workers=1))
    out = []
    try:
        for _ in range(steps):
            loader.next_step()
            ckpt = Checkpoint.from_json(loader.state_dict())
            out.append(list(ckpt.lanes[0].mixture))
    finally:
        loader.close()
    return out


# -- the state of a recipe without phases ---------------------------------------------------

def test_a_recipe_without_phases_keeps_its_lane_state_json(corpus: DemoCorpus) -> None:
    r = recipe(corpus)
    loader = Loader(r, 0, 2, Knobs(workers=1))
    try:
        loader.next_step()
        lanes = loader.state_dict()["lanes"]
    finally:
        loader.close()
    assert lanes and all("mixb" not in lane for lane in lanes.values())
    phased = recipe(corpus, [{"name": "later", "start_step": 50, "weights": {"code": 1.0}}])
    loader = Loader(phased, 0, 2, Knobs(workers=1))
    try:
        loader.next_step()
        lanes = loader.state_dict()["lanes"]
    finally:
        loader.close()
    assert all(lane["mixb"][1] == [0, 0] for lane in lanes.values()), (
        "a recipe with phases saves its re-basing values (no change yet: anchors 0)")


@pytest.mark.parametrize("name", ["checkpoint-v1.json", "checkpoint-v1-bestfit.json",
                                  "checkpoint-v2-wrap.json", "checkpoint-v2-bestfit.json"])
def test_golden_checkpoints_resume_with_a_phase_appended(corpus: DemoCorpus, name: str) -> None:
    # the golden recipe (tests/guarantees/test_golden.py), saved at step 3 by datalane 0.1 / 0.2
    packing = "bestfit" if "bestfit" in name else "wrap"
    golden_recipe = load_recipe(base_recipe_dict(corpus, packing={"algorithm": packing}))
    plan = Plan.build(golden_recipe)
    for step in (0, 3, 10**6):  # its consumed prefix is its document: old states match
        assert prefix_document(plan.fingerprint_doc, step) == plan.fingerprint_doc
    with open(os.path.join(GOLDEN, name)) as f:
        ckpt = Checkpoint.from_json(json.load(f), allow_unsealed=True)  # 0.1 wrote no sha256
    with open(os.path.join(GOLDEN, "hashes.json")) as f:
        golden = json.load(f)[packing]
    # the file identities differ on this machine (as in tests/guarantees/test_golden.py)
    ckpt.fingerprint, ckpt.fingerprint_doc = plan.fingerprint, plan.fingerprint_doc
    data = base_recipe_dict(corpus, packing={"algorithm": packing})
    data["phases"] = [{"name": "code-only", "start_step": 5, "weights": {"web": 0.0}}]
    amended = load_recipe(data)
    rest = run_world(amended, 2, Knobs(workers=1), 3, start=ckpt)
    assert [rest.hashes[s] for s in (3, 4)] == golden[3:5], "before the phase: the golden run"
    assert rest.hashes[5] != golden[5], "from step 5 the appended phase is in force"


# -- weights through the engine ----------------------------------------------------------------

def test_a_jump_stops_and_starts_sources_at_its_step(corpus: DemoCorpus) -> None:
    # code has weight 0 until step 3, web stops at step 5: the lane's counters say so (the
    # packer may still emit carried tokens; the mixture takes no document of a source at 0)
    data = base_recipe_dict(corpus, lanes=1, global_batch_size=8)
    data["sources"][0]["weight"], data["sources"][1]["weight"] = 1.0, 0.0
    data["phases"] = [{"name": "code-in", "start_step": 3, "weights": {"code": 1.0}},
                      {"name": "web-out", "start_step": 5, "weights": {"web": 0.0}}]
    mix = consumed_per_step(load_recipe(data), 12)  # mix[s]: after step s
    assert all(m[1] == 0 for m in mix[:3]), f"code before step 3: {mix}"
    assert mix[4][1] > 0, f"code from step 3: {mix}"
    assert len({m[0] for m in mix[4:]}) == 1, f"no web document from step 5 on: {mix}"
    assert mix[11][1] > mix[4][1], f"code feeds the lane alone: {mix}"


# -- resume anywhere, any world size -----------------------------------------------------------

@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[int, int], tuple[int, int], int]:
    lanes = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    weight = st.sampled_from([0.0, 0.25, 1.0, 3.0])
    web, code = draw(weight), draw(weight)
    if not web + code:
        web = 1.0
    phases = []
    start = 0
    for i in range(draw(st.integers(1, 3))):
        start += draw(st.integers(1, 4))
        if start >= STEPS:
            break
        changes = {name: draw(weight) for name in ("web", "code") if draw(st.booleans())}
        phases.append({"name": f"p{i}", "start_step": start, "weights": changes,
                       "ramp_steps": draw(st.sampled_from([1, 2, 5]))})
    over = {
        "lanes": lanes,
        "global_batch_size": lanes * draw(st.integers(1, 2)),
        "seq_len": draw(st.sampled_from([31, 64, 200])),
        "seed": draw(st.integers(0, 2**31)),
        "shuffle": {"block_size": draw(st.sampled_from([1, 7, 32]))},
        "packing": {"algorithm": draw(st.sampled_from(["wrap", "bestfit"])),
                    "bestfit_bins": draw(st.integers(1, 4))},
        "weights": (web, code),
        "phases": phases,
    }
    worlds = list(range(1, lanes + 1))
    run = (draw(st.sampled_from(worlds)), draw(st.integers(1, 3)))
    resumed = (draw(st.sampled_from(worlds)), draw(st.integers(1, 2)))
    return over, run, resumed, draw(st.integers(0, STEPS - 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=scenario())
def test_random_schedules_resume_anywhere_on_any_world_size(corpus: DemoCorpus,
                                                             case: Any) -> None:
    over, (world, workers), (world2, workers2), cut = case
    weights = over.pop("weights")
    phases = over.pop("phases")
    data = base_recipe_dict(corpus, **over)
    for s, w in zip(data["sources"], weights, strict=True):
        s["weight"] = w
    data["phases"] = phases
    try:
        r = load_recipe(data)
    except Exception as e:  # a phase leaving every weight at 0: the recipe refuses it
        assert "at least one needs a positive weight" in str(e)
        return
    plan = Plan.build(r)
    reference = run_world(r, 1, Knobs(workers=1), STEPS, plan=plan).hashes
    first = run_world(r, world, Knobs(workers=workers), STEPS, plan=plan,
                      save_at=frozenset([cut]))
    assert first.hashes == reference, f"world {world} differs from world 1"
    state = Checkpoint.from_json(json.loads(first.checkpoints[cut].dumps()))
    rest = run_world(r, world2, Knobs(workers=workers2), STEPS - cut, plan=plan, start=state)
    assert rest.hashes == {s: h for s, h in reference.items() if s >= cut}, (
        f"resumed at step {cut} on world {world2} (phases {phases})")


# -- phases appended to a running recipe -------------------------------------------------------

ANNEAL = {"name": "anneal", "start_step": 6, "weights": {"web": 0.1, "code": 0.9},
          "ramp_steps": 3}


def test_a_phase_appended_after_the_resume_step_is_accepted(corpus: DemoCorpus) -> None:
    old = recipe(corpus, global_batch_size=64)
    new = recipe(corpus, [ANNEAL], global_batch_size=64)
    assert Plan.build(old).fingerprint != Plan.build(new).fingerprint
    before = run_world(old, 2, Knobs(workers=2), 6, save_at=frozenset([4]))
    uninterrupted = run_world(new, 1, Knobs(workers=2), 10).hashes
    assert {s: h for s, h in uninterrupted.items() if s < 6} == before.hashes, (
        "a phase changes nothing before its start step")
    resumed = run_world(new, 3, Knobs(workers=2), 6, start=before.checkpoints[4])
    assert resumed.hashes == {s: h for s, h in uninterrupted.items() if s >= 4}, (
        "resumed with the phase appended == the run that had it from the start")
    plain = run_world(old, 1, Knobs(workers=1), 10).hashes
    assert any(resumed.hashes[s] != plain[s] for s in range(6, 10)), (
        "the appended phase is in force")


def test_a_phase_appended_exactly_at_the_resume_step_is_accepted(corpus: DemoCorpus) -> None:
    before = run_world(recipe(corpus), 2, Knobs(workers=1), 4, save_at=frozenset([3]))
    new = recipe(corpus, [{**ANNEAL, "start_step": 3}])
    first = run_world(new, 1, Knobs(workers=1), 4, start=before.checkpoints[3],
                      save_at=frozenset([5]))
    again = run_world(new, 2, Knobs(workers=1), 2, start=first.checkpoints[5])
    assert again.hashes == {s: h for s, h in first.hashes.items() if s >= 5}


def test_editing_a_phase_that_has_started_is_refused_naming_it(corpus: DemoCorpus) -> None:
    old = recipe(corpus, [ANNEAL])
    run = run_world(old, 1, Knobs(workers=1), 8, save_at=frozenset([7]))
    edited = recipe(corpus, [{**ANNEAL, "weights": {"web": 0.1, "code": 0.8}}])
    with pytest.raises(MismatchError) as info:
        run_world(edited, 1, Knobs(workers=1), 1, start=run.checkpoints[7])
    text = str(info.value)
    assert "in what the 7 steps before the resume consumed (phases starting at or after " \
           "step 7 may change); these fields differ:\n" in text
    assert "  phases[0] 'anneal' (starts at step 6, before the resume step 7): weights.code " \
           "saved 0.9, now 0.8" in text
    # the same edit at a checkpoint before the phase started is fine
    early = run_world(old, 1, Knobs(workers=1), 5, save_at=frozenset([4]))
    run_world(edited, 1, Knobs(workers=1), 1, start=early.checkpoints[4])


def test_a_new_source_for_a_later_phase_comes_after_the_others(corpus: DemoCorpus) -> None:
    old = recipe(corpus, global_batch_size=64)
    books = {"name": "books", "uris": [corpus.code], "weight": 0.0, "epochs": None,
             "chunk_bytes": 8192}
    bring = {"name": "books-in", "start_step": 6, "weights": {"books": 2.0}}
    new = recipe(corpus, [bring], extra=[books], global_batch_size=64)
    before = run_world(old, 2, Knobs(workers=1), 6, save_at=frozenset([4]))
    resumed = run_world(new, 2, Knobs(workers=1), 4, start=before.checkpoints[4],
                        save_at=frozenset([7]))
    assert {s: resumed.hashes[s] for s in (4, 5)} == {s: before.hashes[s] for s in (4, 5)}
    assert resumed.hashes == {s: h for s, h in run_world(new, 1, Knobs(workers=1),
                                                         8).hashes.items() if s >= 4}
    lanes = resumed.checkpoints[7].lanes.values()
    assert all(len(lane.sources) == 3 for lane in lanes)
    assert sum(lane.mixture[2] for lane in lanes) > 0, "books feeds the lanes from step 6"
    # the added source before the others, or in use before the resume step: refused
    first = recipe(corpus, [bring], extra=[books], global_batch_size=64)
    reordered = load_recipe({**first.to_dict(), "sources": [first.to_dict()["sources"][2],
                                                             *first.to_dict()["sources"][:2]]})
    with pytest.raises(MismatchError, match="source_index"):
        run_world(reordered, 1, Knobs(workers=1), 1, start=before.checkpoints[4])
    early = recipe(corpus, [{**bring, "start_step": 2}], extra=[books], global_batch_size=64)
    with pytest.raises(MismatchError, match=r"phases\[0\] 'books-in' \(starts at step 2"):
        run_world(early, 1, Knobs(workers=1), 1, start=before.checkpoints[4])


def test_a_sources_chunk_dealing_does_not_depend_on_the_other_sources(
        corpus: DemoCorpus) -> None:
    alone = Plan.build(recipe(corpus, sources=[base_recipe_dict(corpus)["sources"][1]]))
    books = {"name": "books", "uris": [corpus.web], "weight": 0.0, "chunk_rows": 25}
    more = Plan.build(recipe(corpus, [{"name": "in", "start_step": 9, "weights":
                                       {"books": 1.0}}], extra=[books]))
    code_alone, code_more = alone.sources[0], more.sources[1]
    assert code_alone.source.name == code_more.source.name == "code"
    for lane in range(8):
        for epoch in range(3):
            assert code_alone.lane_chunks(lane, epoch) == code_more.lane_chunks(lane, epoch)

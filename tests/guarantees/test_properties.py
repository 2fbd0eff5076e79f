"""Hypothesis: for random recipes and topologies, every run yields the same global hashes.

Each example draws a recipe (one or two sources, lanes, weights, epochs or repeat, packing,
block size, chunking, seed), a reference run on one rank and one worker, and a second run on a
random world size dividing the lanes with random knobs that is interrupted at a random step
and resumed on yet another world size and worker count.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datalane.engine.plan import Plan
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from tests.conftest import base_recipe_dict

STEPS = 10


@st.composite
def scenario(draw):
    lanes = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    two = draw(st.booleans())
    sources = [{"name": "web", "uris": ["WEB"], "weight": draw(st.sampled_from([0.5, 1.0, 3.0])),
                "epochs": draw(st.sampled_from([1, 2, None])),
                "chunk_rows": draw(st.sampled_from([25, 50, None]))}]
    if two:
        sources.append({"name": "code", "uris": ["CODE"],
                        "weight": draw(st.sampled_from([0.25, 1.0])),
                        "epochs": draw(st.sampled_from([1, None])),
                        "chunk_bytes": draw(st.sampled_from([4096, 9000]))})
    overrides = {
        "lanes": lanes,
        "global_batch_size": lanes * draw(st.integers(1, 3)),
        "seq_len": draw(st.sampled_from([31, 64, 200])),
        "seed": draw(st.integers(0, 2**31)),
        "sources": sources,
        "shuffle": {"block_size": draw(st.sampled_from([1, 7, 32]))},
        "packing": {"algorithm": draw(st.sampled_from(["wrap", "bestfit"])),
                    "bestfit_bins": draw(st.integers(1, 5))},
        "tokenizer": {"uri": "TOK", "add_bos": draw(st.booleans())},
    }
    worlds = list(range(1, lanes + 1))  # any world size, divisors of the lanes or not
    run = (draw(st.sampled_from(worlds)), draw(st.integers(1, 3)), draw(st.integers(1, 4)),
           draw(st.integers(1, 9)))
    resumed = (draw(st.sampled_from(worlds)), draw(st.integers(1, 3)))
    return overrides, run, resumed, draw(st.integers(0, STEPS - 1))  # a step left to resume


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=scenario())
def test_random_recipes_give_identical_global_batches(corpus, case) -> None:
    overrides, (world, workers, prefetch, task_docs), (world2, workers2), cut = case
    for src in overrides["sources"]:
        src["uris"] = [corpus.web if src["name"] == "web" else corpus.code]
    overrides["tokenizer"]["uri"] = corpus.tokenizer
    recipe = load_recipe(base_recipe_dict(corpus, **overrides))
    plan = Plan.build(recipe)
    reference = run_world(recipe, 1, Knobs(workers=1), STEPS, plan=plan).hashes
    knobs = Knobs(workers=workers, prefetch=prefetch, task_docs=task_docs)
    first = run_world(recipe, world, knobs, STEPS, plan=plan, save_at=frozenset([cut]))
    assert first.hashes == reference
    rest = run_world(recipe, world2, Knobs(workers=workers2), STEPS - cut, plan=plan,
                     start=first.checkpoints[cut])
    assert rest.hashes == {s: h for s, h in reference.items() if s >= cut}

"""Packing in bulk is packing one document at a time, on real lanes.

A lane whose packer can fill a whole window (``wrap``) asks the mixture for *runs* of
documents (``Mixture.next_run`` -> ``DocStream.next_run``) instead of one document per call.
That is a speed path only: for random recipes (one to three sources with uneven weights,
malformed and filtered records in between, shuffle blocks that end inside a run, sequences
shorter and longer than documents, BOS/EOS) every window, every digest, every lane state
(cursors, mixture counters, carry-over, counters) after every window must be the same as
the lane packing sequence by sequence with ``next_doc``, and a state saved by either path
must continue identically in the other.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datalane.engine.lane import LaneStream
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from tests.conftest import base_recipe_dict

WINDOWS = 14


def per_sequence(stream: LaneStream) -> LaneStream:
    stream._fill = None  # the lane's sequence-by-sequence path
    return stream


def same_window(a, b, where: str) -> None:
    assert a.ended == b.ended, f"{where}: ended {a.ended} (bulk) != {b.ended} (one by one)"
    for name in a.columns:
        assert np.array_equal(a.columns[name], b.columns[name]), (
            f"{where}: column {name!r} differs between bulk and one-by-one packing")
    assert a.digest == b.digest


def write_noisy(tmp: Path) -> str:
    """JSONL with malformed lines, empty and short texts between real documents."""
    lines = []
    for i in range(300):
        k = i % 9
        if k == 2:
            lines.append("{not json")
        elif k == 5:
            lines.append(json.dumps({"text": ""}))
        elif k == 7:
            lines.append(json.dumps({"other": "field"}))
        else:
            lines.append(json.dumps({"text": " ".join(["noisy"] * (1 + (i * 37) % 150))}))
    path = tmp / "noisy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@st.composite
def recipes(draw):
    n = draw(st.integers(1, 3))
    sources = [{"name": "web", "uris": ["WEB"], "weight": draw(st.sampled_from([0.3, 1.0, 2.5])),
                "epochs": draw(st.sampled_from([1, 2])), "chunk_rows": 40}]
    if n >= 2:
        sources.append({"name": "code", "uris": ["CODE"],
                        "weight": draw(st.sampled_from([0.2, 1.0, 1.7])),
                        "epochs": draw(st.sampled_from([1, None])), "chunk_bytes": 6000})
    if n >= 3:
        sources.append({"name": "noisy", "uris": ["NOISY"], "weight": 0.5, "epochs": 1,
                        "chunk_bytes": 3000})
    return {
        "lanes": 2,
        "global_batch_size": 2 * draw(st.integers(1, 3)),
        "seq_len": draw(st.sampled_from([15, 64, 300])),
        "seed": draw(st.integers(0, 1000)),
        "sources": sources,
        "shuffle": {"block_size": draw(st.sampled_from([1, 5, 64]))},
        "filters": {"min_tokens": draw(st.sampled_from([0, 3, 20]))},
        "tokenizer": {"uri": "TOK", "add_bos": draw(st.booleans())},
    }, draw(st.integers(1, WINDOWS - 1)), draw(st.integers(1, 3)), draw(st.integers(1, 64))


@settings(max_examples=30, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=recipes())
def test_bulk_packing_equals_one_document_at_a_time(corpus, tmp_path, case) -> None:
    data, cut, workers, task_docs = case
    noisy = write_noisy(tmp_path)
    for src in data["sources"]:
        src["uris"] = [{"web": corpus.web, "code": corpus.code, "noisy": noisy}[src["name"]]]
    data["tokenizer"]["uri"] = corpus.tokenizer
    recipe = load_recipe(base_recipe_dict(corpus, **data))
    plan = Plan.build(recipe)
    stages = plan.map_stages()
    knobs = Knobs(workers=workers, task_docs=task_docs)
    with TaskPool(workers) as pool:
        for lane in range(recipe.lanes):
            bulk = LaneStream(plan, lane, stages, pool, knobs)
            assert bulk._fill is not None, "a wrap lane must fill its windows in bulk"
            one = per_sequence(LaneStream(plan, lane, stages, pool, knobs))
            saved = None
            for w in range(WINDOWS):
                same_window(bulk.next_window(), one.next_window(), f"lane {lane} window {w}")
                assert bulk.state() == one.state(), (
                    f"lane {lane} after window {w}: the states differ\n bulk {bulk.state()}\n "
                    f"one by one {one.state()}")
                if w + 1 == cut:
                    saved = bulk.state()
            assert saved is not None
            # a state saved in bulk continues one by one, and the other way round
            a = per_sequence(LaneStream(plan, lane, stages, pool, knobs, saved))
            b = LaneStream(plan, lane, stages, pool, knobs, saved)
            for w in range(cut, WINDOWS):
                same_window(a.next_window(), b.next_window(), f"lane {lane} resumed window {w}")
            assert a.state() == b.state() == one.state()
            for s in (bulk, one, a, b):
                s.close()

"""Golden outputs: any change to the stream or to the state format must be deliberate.

``tests/golden/hashes.json`` holds the first global step hashes of a fixed recipe over the
deterministic test corpus, for both packers. ``tests/golden/checkpoint-v1.json`` is a
checkpoint written by datalane 0.1 (state schema v1); it must keep loading and must continue
the stream exactly. To accept an intended change, run
``python -m tests.test_golden --update`` and explain the change in the commit message.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

from datalane.corpus import make_corpus
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.spec.state import Checkpoint
from tests.conftest import base_recipe_dict

HERE = os.path.join(os.path.dirname(__file__), "golden")
STEPS = 6
SAVED_AT = 3


def _recipe(corpus, packing: str):
    return load_recipe(base_recipe_dict(corpus, packing={"algorithm": packing}))


@pytest.mark.parametrize("packing", ["wrap", "bestfit"])
def test_golden_step_hashes(corpus, packing) -> None:
    with open(os.path.join(HERE, "hashes.json")) as f:
        golden = json.load(f)[packing]
    hashes = run_world(_recipe(corpus, packing), 2, Knobs(workers=2), STEPS).hashes
    assert [hashes[s] for s in range(STEPS)] == golden


def test_golden_checkpoint_still_restores(corpus) -> None:
    with open(os.path.join(HERE, "checkpoint-v1.json")) as f:
        saved = json.load(f)
    with open(os.path.join(HERE, "hashes.json")) as f:
        golden = json.load(f)["wrap"]
    recipe = _recipe(corpus, "wrap")
    ckpt = Checkpoint.from_json(saved)
    # the file identities differ on this machine; the lane states are what is checked here
    from datalane.engine.plan import Plan

    plan = Plan.build(recipe)
    ckpt.fingerprint, ckpt.fingerprint_doc = plan.fingerprint, plan.fingerprint_doc
    rest = run_world(recipe, 4, Knobs(workers=1), STEPS - SAVED_AT, plan=plan, start=ckpt)
    assert [rest.hashes[s] for s in range(SAVED_AT, STEPS)] == golden[SAVED_AT:]
    assert all(s.encoded_size() < 1024 for s in ckpt.lanes.values())


def _update() -> None:
    corpus = make_corpus(tempfile.mkdtemp(), web_docs=600)
    out = {}
    for packing in ("wrap", "bestfit"):
        hashes = run_world(_recipe(corpus, packing), 1, Knobs(), STEPS).hashes
        out[packing] = [hashes[s] for s in range(STEPS)]
    with open(os.path.join(HERE, "hashes.json"), "w") as f:
        json.dump(out, f, indent=1)
    run = run_world(_recipe(corpus, "wrap"), 1, Knobs(), SAVED_AT,
                    save_at=frozenset([SAVED_AT]))
    ckpt = run.checkpoints[SAVED_AT]
    ckpt.fingerprint_doc = None
    with open(os.path.join(HERE, "checkpoint-v1.json"), "w") as f:
        json.dump(ckpt.to_json(), f, indent=1, sort_keys=True)
    print("golden files rewritten; review `git diff tests/golden`")


if __name__ == "__main__":
    if "--update" in sys.argv:
        _update()

"""Golden outputs: any change to the stream or to the state format must be deliberate.

``tests/golden/hashes.json`` holds the first global step hashes of a fixed recipe over the
deterministic test corpus, for both packers. ``tests/golden/checkpoint-v1.json`` (wrap,
written by datalane 0.1) and ``checkpoint-v1-bestfit.json`` (bestfit: open sequences and
pending pieces) are checkpoints of lane-state schema v1; they must keep loading and must
continue the stream exactly. Golden files are append-only: ``python -m tests.guarantees.test_golden
--update`` rewrites the hashes (explain the change in the commit message) and *adds* a
checkpoint of today's lane-state version when none exists; it never rewrites an old one.
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
from tests.support import paths

HERE = str(paths.GOLDEN)
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


@pytest.mark.slow  # map processes: child interpreters
@pytest.mark.parametrize("packing", ["wrap", "bestfit"])
def test_golden_step_hashes_with_the_map_stages_in_processes(corpus, packing) -> None:
    """The knob ``map_processes`` moves the map stages into child processes
    (datalane/engine/mapprocs.py); the steps stay the golden ones."""
    with open(os.path.join(HERE, "hashes.json")) as f:
        golden = json.load(f)[packing]
    knobs = Knobs(map_processes=2, task_docs=8)  # many small tasks across both children
    assert [run_world(_recipe(corpus, packing), 2, knobs, STEPS).hashes[s]
            for s in range(STEPS)] == golden


def _checkpoints() -> list[tuple[str, str]]:
    """(file, packing) of every golden checkpoint; the packing is in the name."""
    names = sorted(n for n in os.listdir(HERE) if n.startswith("checkpoint-"))
    return [(n, "bestfit" if "bestfit" in n else "wrap") for n in names]


def test_golden_checkpoints_cover_both_packers_and_versions() -> None:
    got = _checkpoints()
    assert ("checkpoint-v1.json", "wrap") in got
    assert ("checkpoint-v1-bestfit.json", "bestfit") in got


@pytest.mark.parametrize(("name", "packing"), _checkpoints())
def test_golden_checkpoint_still_restores(corpus, name, packing) -> None:
    with open(os.path.join(HERE, name)) as f:
        saved = json.load(f)
    with open(os.path.join(HERE, "hashes.json")) as f:
        golden = json.load(f)[packing]
    recipe = _recipe(corpus, packing)
    ckpt = Checkpoint.from_json(saved, allow_unsealed=True)  # 0.1 wrote no sha256
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
    from datalane.spec.state import LANE_STATE_VERSION

    for packing in ("wrap", "bestfit"):
        path = os.path.join(HERE, f"checkpoint-v{LANE_STATE_VERSION}-{packing}.json")
        if os.path.exists(path) or (LANE_STATE_VERSION == 1 and packing == "wrap"):
            continue  # append-only: a checkpoint once written is the fixture forever
        run = run_world(_recipe(corpus, packing), 1, Knobs(), SAVED_AT,
                        save_at=frozenset([SAVED_AT]))
        ckpt = run.checkpoints[SAVED_AT]
        ckpt.fingerprint_doc = None
        with open(path, "w") as f:
            json.dump(ckpt.to_json(), f, indent=1, sort_keys=True)
    print("golden hashes rewritten; review `git diff tests/golden`")


if __name__ == "__main__":
    if "--update" in sys.argv:
        _update()

"""A real run amended on purpose, through the store: the engine's lanes over the test corpus
checkpoint at step 6 under recipe A (phase 'warmup' from step 2), the run resumes there under
B = A + phase 'anneal' from step 8, and checkpoints at step 16.

Two ranks stand for two pods: each writes its lane states and window digests as a sidecar
does (``write_pod`` with the plan's fingerprint and document), the last one commits. The
audit then proves the steps before 6 unchanged, and the ledger is, step for step, what one
uninterrupted process computes under B (so the steps before the anneal are also A's, and
the anneal visibly changed the batches from step 8 on).
"""

from __future__ import annotations

from typing import Any

from datalane.corpus import DemoCorpus
from datalane.engine.loader import Loader
from datalane.engine.plan import Plan
from datalane.runner import run_world
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from datalane.spec.state import Checkpoint
from datalane.store import CheckpointStore
from datalane.store.amendments import PhaseStart
from tests.conftest import base_recipe_dict

from .conftest import Backend

WARMUP = {"name": "warmup", "start_step": 2, "weights": {"web": 1.0}}
ANNEAL = {"name": "anneal", "start_step": 8, "weights": {"web": 0.1, "code": 0.9},
          "ramp_steps": 2}
KNOBS = Knobs(workers=1)


def recipe(corpus: DemoCorpus, phases: list[dict[str, Any]]) -> Recipe:
    sources = base_recipe_dict(corpus)["sources"]
    for s in sources:
        s["epochs"] = None  # endless: the anneal's mix must have code left to take
    return load_recipe(base_recipe_dict(corpus, sources=sources, phases=phases))


def serve(store: CheckpointStore, r: Recipe, start: int, until: int) -> None:
    """Two ranks of ``r`` serve steps ``start .. until - 1`` (resumed from the store's
    checkpoint of ``start`` unless it is 0), then checkpoint ``until`` as two pods."""
    plan = Plan.build(r)
    loaders = [Loader(r, rank, 2, KNOBS, plan=plan) for rank in range(2)]
    try:
        if start:
            saved = store.load(start, fingerprint=plan.fingerprint,
                               fingerprint_doc=plan.fingerprint_doc)
            for loader in loaders:
                loader.load_state_dict(saved)
        digests: list[dict[int, dict[int, bytes]]] = [{}, {}]
        for _ in range(start, until):
            for rank, loader in enumerate(loaders):
                step = loader.next_step()
                digests[rank][step.step] = dict(step.lane_digests)
        for rank, loader in enumerate(loaders):
            lanes = Checkpoint.from_json(loader.state_dict()).lanes
            store.write_pod(until, rank, lanes, digests[rank], plan.fingerprint,
                            plan.fingerprint_doc, r.lanes)
        assert store.commit(until) is not None
    finally:
        for loader in loaders:
            loader.close()


def test_an_amended_run_audits_and_its_ledger_is_the_new_recipes(corpus: DemoCorpus,
                                                                 local: Backend) -> None:
    a, b = recipe(corpus, [WARMUP]), recipe(corpus, [WARMUP, ANNEAL])
    store = local.store()
    serve(store, a, 0, 6)
    serve(store, b, 6, 16)
    assert store.manifest(6).phases == (PhaseStart("warmup", 2),)
    assert store.manifest(16).phases == (PhaseStart("warmup", 2), PhaseStart("anneal", 8))
    report = store.audit()
    assert report.ok, report.text()
    (amendment,) = report.amendments
    assert (amendment.before, amendment.after, amendment.appended) == (
        6, 16, (PhaseStart("anneal", 8),))
    assert report.intact_before == (True,)
    ledger = dict(report.ledger)
    assert sorted(ledger) == list(range(16))
    under_b = run_world(b, 1, KNOBS, 16).hashes
    under_a = run_world(a, 1, KNOBS, 16).hashes
    assert ledger == under_b
    # A and B agree before the anneal (by construction), and the anneal changed the batches
    # (the corpus' long code documents span steps: its first effect shows at step 12)
    assert all(under_a[s] == under_b[s] for s in range(8))
    assert [s for s in range(8, 16) if under_a[s] != under_b[s]] == [12, 13, 14, 15]

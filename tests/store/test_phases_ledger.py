"""Phases in the ledger: manifests record where each phase begins, and the audit proves that
a recipe amended between two checkpoints left the steps before the change unchanged.

The run: checkpoints 10 and 20 under recipe A (phase 'warmup' from step 5), then resumed at
step 20 under B = A + phase 'anneal' from step 25 (between checkpoints 20 and 30),
checkpoints 30 and 40. The fingerprint documents are the engine's shape
(``{"recipe": Recipe.to_dict(), "files": ...}``).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from datalane.spec.errors import MismatchError, StorageError
from datalane.spec.fingerprint import fingerprint_of
from datalane.spec.phases import prefix_document
from datalane.spec.recipe import load_recipe
from datalane.store import CheckpointStore
from datalane.store.amendments import PhaseStart

from .conftest import Backend
from .support import LANES, digest, lane_state, pod_lanes

WARMUP = {"name": "warmup", "start_step": 5, "weights": {"web": 1.0}}
ANNEAL = {"name": "anneal", "start_step": 25, "weights": {"web": 0.2, "code": 0.8},
          "ramp_steps": 4}


def fp_doc(phases: list[dict[str, Any]], seed: int = 5) -> dict[str, Any]:
    recipe = load_recipe({
        "seq_len": 16, "lanes": LANES, "global_batch_size": 16, "seed": seed,
        "tokenizer": {"uri": "/t/tok.json"},
        "sources": [{"name": "web", "uris": ["/d/web.jsonl"], "weight": 0.7},
                    {"name": "code", "uris": ["/d/code.jsonl"], "weight": 0.3}],
        "phases": copy.deepcopy(phases)})
    return {"recipe": recipe.to_dict(),
            "files": {"web": [["/d/web.jsonl", 100, "m1"]],
                      "code": [["/d/code.jsonl", 50, "m2"]]}}


A = fp_doc([WARMUP])
B = fp_doc([WARMUP, ANNEAL])


def commit(store: CheckpointStore, step: int, since: int | None, doc: dict[str, Any]) -> None:
    """Both pods of ``step`` under the recipe of ``doc``, with digests since ``since``."""
    for pod in range(2):
        own = pod_lanes(pod, 2)
        digests = {s: {lane: digest(s, lane) for lane in own}
                   for s in range(since or 0, step)}
        store.write_pod(step, pod, {lane: lane_state(lane, step) for lane in own}, digests,
                        fingerprint_of(doc), doc, LANES)
    assert store.commit(step) is not None


def amended_run(store: CheckpointStore, later: dict[str, Any] = B) -> None:
    commit(store, 10, None, A)
    commit(store, 20, 10, A)
    commit(store, 30, 20, later)
    commit(store, 40, 30, later)


def test_each_manifest_records_the_phases_of_its_recipe(backend: Backend) -> None:
    store = backend.store()
    amended_run(store)
    assert store.manifest(20).phases == (PhaseStart("warmup", 5),)
    assert store.manifest(30).phases == (PhaseStart("warmup", 5), PhaseStart("anneal", 25))
    doc = json.loads(backend.read(30, "MANIFEST.json"))
    assert doc["phases"] == [{"name": "warmup", "start_step": 5},
                             {"name": "anneal", "start_step": 25}]


def test_a_recipe_without_phases_writes_no_phases_key(local: Backend) -> None:
    store = local.store()
    commit(store, 10, None, fp_doc([]))
    assert "phases" not in json.loads(local.read(10, "MANIFEST.json"))
    assert store.manifest(10).phases == ()


def test_the_audit_proves_the_steps_before_an_appended_phase_unchanged(backend: Backend,
                                                                       ) -> None:
    store = backend.store()
    amended_run(store)
    report = store.audit()
    assert report.ok, report.text()
    (amendment,) = report.amendments
    assert (amendment.before, amendment.after) == (20, 30)
    assert amendment.appended == (PhaseStart("anneal", 25),)
    assert amendment.changed == () and amendment.removed == ()
    # the consumed prefix at step 20 is the same document under both recipes
    assert amendment.prefix_fingerprint == fingerprint_of(prefix_document(A, 20))
    assert amendment.prefix_fingerprint == fingerprint_of(prefix_document(B, 20))
    assert report.intact_before == (True,)
    by_step = {e.step: e for e in report.entries}
    assert by_step[30].notes == ("recipe amended since checkpoint 20: phase 'anneal' (from "
                                 "step 25) appended; the steps before 20 are unchanged",)
    text = report.text().splitlines()
    i = text.index("phases (where each begins, as the checkpoints' recipes say):")
    assert text[i + 1:i + 5] == [
        "  warmup           from step        5  in every checkpoint, served since that step",
        "  anneal           from step       25  since checkpoint 30, served since that step",
        "recipe amendments:",
        f"  after step 20 (checkpoint 30): phase 'anneal' (from step 25) appended; steps "
        f"before 20 unchanged (consumed prefix {amendment.prefix_fingerprint[:16]}...), "
        f"ledger continuous and hash chain intact before it",
    ]
    assert text[-1] == ("OK: 4 checkpoints verified, hash chain intact, ledger continuous over "
                        "steps 0-39, recipe amended after step 20 with the steps before it "
                        "unchanged")
    doc = report.to_json()
    assert doc["amendments"][0]["appended"] == [{"name": "anneal", "start_step": 25}]
    assert doc["amendments"][0]["ledger_intact_before"] is True
    assert [p["name"] for p in doc["phases"]] == ["warmup", "anneal"]
    json.dumps(doc)


def test_a_phase_not_reached_yet_is_reported_so(local: Backend) -> None:
    store = local.store()
    late = fp_doc([WARMUP, {**ANNEAL, "start_step": 90}])
    amended_run(store, late)
    report = store.audit()
    assert report.ok, report.text()
    assert ("  anneal           from step       90  since checkpoint 30, not reached yet"
            in report.text().splitlines())


def test_editing_a_consumed_phase_fails_the_audit_naming_it(backend: Backend) -> None:
    store = backend.store()
    past = fp_doc([{**WARMUP, "weights": {"web": 0.9}}, ANNEAL])
    amended_run(store, past)
    report = store.audit()
    assert not report.ok
    problems = report.all_problems()
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        "step 30: checkpoint 30 was written under another recipe than checkpoint 20, and it "
        "changes what steps before 20 consumed (already served and in the ledger)")
    assert ("phases[0] 'warmup' (starts at step 5, before the resume step 20): weights.web "
            "saved 1.0, now 0.9") in problems[0]
    text = report.text().splitlines()
    assert ("          phases[0] 'warmup' (starts at step 5, before the resume step 20): "
            "weights.web saved 1.0, now 0.9") in text  # under its problem
    assert ("  after step 20 (checkpoint 30): phase 'anneal' (from step 25) appended; phase "
            "'warmup' (from step 5) changed: FAILED, see the problem of step 30") in text
    assert report.text().splitlines()[-1] == "FAILED: 1 problems"


def test_a_phase_inserted_before_the_resume_step_fails_the_audit(local: Backend) -> None:
    store = local.store()
    early = fp_doc([WARMUP, {**ANNEAL, "start_step": 15}])  # inside steps 10-19, served by A
    amended_run(store, early)
    report = store.audit()
    assert not report.ok
    (problem,) = report.all_problems()
    assert ("phases[1] 'anneal' (starts at step 15, before the resume step 20): added"
            in problem), problem


def test_another_seed_fails_the_audit(local: Backend) -> None:
    store = local.store()
    amended_run(store, fp_doc([WARMUP], seed=6))
    (problem,) = store.audit().all_problems()
    assert "recipe.seed: saved 5, now 6" in problem, problem


def test_files_changed_under_the_recipe_fail_the_audit(local: Backend) -> None:
    store = local.store()
    changed = copy.deepcopy(B)
    changed["files"]["web"][0][2] = "m9"  # the file changed under the recipe
    amended_run(store, changed)
    (problem,) = store.audit().all_problems()
    assert "files.web: 1 of 1 file changed: /d/web.jsonl" in problem, problem


def test_a_changed_recipe_without_documents_cannot_be_proven(local: Backend) -> None:
    store = local.store()
    for step, since, fp in ((10, None, "a" * 64), (20, 10, "b" * 64)):
        for pod in range(2):
            own = pod_lanes(pod, 2)
            store.write_pod(step, pod, {lane: lane_state(lane, step) for lane in own},
                            {s: {lane: digest(s, lane) for lane in own}
                             for s in range(since or 0, step)}, fp, None, LANES)
        assert store.commit(step) is not None
    (problem,) = store.audit().all_problems()
    assert problem == ("step 20: checkpoint 20 was written under another recipe than "
                       "checkpoint 10 (fingerprint aaaaaaaaaaaaaaaa... -> bbbbbbbbbbbbbbbb...), "
                       "and checkpoint 10 carries no fingerprint document: the steps before "
                       "10 cannot be proven unchanged")


def test_a_ledger_gap_before_the_amendment_is_reported_with_it(local: Backend) -> None:
    store = local.store()
    commit(store, 10, None, A)
    commit(store, 20, 12, A)  # digests only since step 12: steps 10, 11 missing
    commit(store, 30, 20, B)
    report = store.audit()
    assert not report.ok
    assert report.intact_before == (False,)
    assert any("ledger gap: no global batch hash for steps 10-11" in p
               for p in report.all_problems())
    assert any(line.endswith("but the ledger or hash chain before it is broken (problems "
                             "below)") for line in report.text().splitlines())


def test_an_edited_phases_list_does_not_verify(local: Backend) -> None:
    store = local.store()
    amended_run(store)
    doc = json.loads(local.read(30, "MANIFEST.json"))
    doc["phases"][1]["start_step"] = 21  # claim the phase began earlier
    local.write(30, "MANIFEST.json",
                json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    with pytest.raises(StorageError, match=r"does not match the pod objects it lists "
                                           r"\(differs in: phases\)"):
        local.store().manifest(30)
    doc["phases"] = []
    local.write(30, "MANIFEST.json",
                json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    with pytest.raises(StorageError, match="phases must list at least one phase"):
        local.store().manifest(30)


def test_a_resume_under_appended_phases_loads_and_one_editing_the_past_is_refused(
        local: Backend) -> None:
    """``load(fingerprint=...)`` (the sidecar's ledger backfill) compares consumed prefixes."""
    store = local.store()
    commit(store, 10, None, A)
    commit(store, 20, 10, A)
    ckpt = store.load(20, [0, 1], fingerprint=fingerprint_of(B), fingerprint_doc=B)
    assert sorted(ckpt.lanes) == [0, 1]
    past = fp_doc([{**WARMUP, "start_step": 6}, ANNEAL])
    with pytest.raises(MismatchError, match=r"phases\[0\] 'warmup' \(starts at step 5, before "
                                            r"the resume step 20\): start_step saved 5, now 6"):
        store.load(20, fingerprint=fingerprint_of(past), fingerprint_doc=past)
    # a phase starting exactly at the checkpoint's step has consumed nothing yet
    at = fp_doc([WARMUP, {**ANNEAL, "start_step": 20}])
    assert store.load(20, fingerprint=fingerprint_of(at), fingerprint_doc=at).step == 20


def test_a_committed_step_rewritten_under_appended_phases_is_the_same_run(local: Backend,
                                                                         ) -> None:
    """A trainer resumed at step 20 under B that checkpoints step 20 again (its first save)."""
    store = local.store()
    commit(store, 10, None, A)
    commit(store, 20, 10, A)
    own = pod_lanes(0, 2)
    states = {lane: lane_state(lane, 20) for lane in own}
    uri = store.write_pod(20, 0, states, {}, fingerprint_of(B), B, LANES)
    assert uri.endswith("MANIFEST.json")
    past = fp_doc([{**WARMUP, "weights": {"web": 0.9}}])
    with pytest.raises(MismatchError, match="step 20 is already committed"):
        store.write_pod(20, 0, states, {}, fingerprint_of(past), past, LANES)


def test_a_step_whose_pods_serve_two_recipes_is_refused_with_the_way_out(local: Backend,
                                                                         ) -> None:
    """Pods of one step under A and B (the DataPipeline was edited, one pod restarted)."""
    store = local.store()
    for pod, doc in ((0, A), (1, B)):
        own = pod_lanes(pod, 2)
        store.write_pod(10, pod, {lane: lane_state(lane, 10) for lane in own}, {},
                        fingerprint_of(doc), doc, LANES)
    with pytest.raises(MismatchError, match=r"step 10 mixes recipes: .*; both recipes served "
                                            r"the same steps so far .* restart every pod of "
                                            r"the job"):
        store.commit(10)
    other = Backend(local.kind, local.uri + "-seed", {}).store()
    for pod, doc in ((0, A), (1, fp_doc([WARMUP], seed=6))):
        own = pod_lanes(pod, 2)
        other.write_pod(10, pod, {lane: lane_state(lane, 10) for lane in own}, {},
                        fingerprint_of(doc), doc, LANES)
    with pytest.raises(MismatchError, match=r"step 10 mixes recipes") as err:
        other.commit(10)
    assert "both recipes served" not in str(err.value)


def test_a_document_that_does_not_hash_to_its_fingerprint_proves_nothing(local: Backend,
                                                                         ) -> None:
    store = local.store()
    commit(store, 10, None, A)
    for pod in range(2):  # B's document under a made-up fingerprint
        own = pod_lanes(pod, 2)
        store.write_pod(20, pod, {lane: lane_state(lane, 20) for lane in own},
                        {s: {lane: digest(s, lane) for lane in own} for s in range(10, 20)},
                        "c" * 64, B, LANES)
    assert store.commit(20) is not None
    (problem,) = store.audit().all_problems()
    assert problem.endswith("and checkpoint 20 carries a fingerprint document that does not "
                            "hash to its fingerprint: the steps before 10 cannot be proven "
                            "unchanged"), problem
    with pytest.raises(MismatchError, match="was saved with recipe fingerprint"):
        store.load(10, fingerprint="c" * 64, fingerprint_doc=B)


def test_a_phase_removed_before_it_began_is_reported_with_its_checkpoints(local: Backend,
                                                                          ) -> None:
    store = local.store()
    planned = fp_doc([WARMUP, {**ANNEAL, "start_step": 90}])
    commit(store, 10, None, planned)
    commit(store, 20, 10, planned)
    commit(store, 30, 20, A)  # resumed at 20 without the anneal that was never reached
    report = store.audit()
    assert report.ok, report.text()
    (amendment,) = report.amendments
    assert amendment.removed == (PhaseStart("anneal", 90),) and amendment.appended == ()
    assert amendment.what() == "phase 'anneal' (from step 90) removed"
    assert ("  anneal           from step       90  in checkpoints 10-20, removed since"
            in report.text().splitlines())

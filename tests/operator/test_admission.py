"""Admission verdicts for DataPipelines, PyTorchJobs and pytorchjobs/scale."""

from __future__ import annotations

import copy
import json

import pytest
from datalane_operator.admission import (
    LAST_APPLIED,
    Verdict,
    dropped_nulls,
    review_pipeline,
    review_scale,
    review_workload,
)
from datalane_operator.amend import Progress
from datalane_operator.pipeline import Parallelism
from datalane_operator.policy import Policy

from .builders import dp, job, scale

STORE = "s3://ckpt/run-1"  # the builders' spec.checkpoint.uri
ISSUE_MESSAGE = "8 lanes cannot be split over 9 workers; use 1 to 8"


def test_a_good_pipeline_is_allowed() -> None:
    v = review_pipeline(dp())
    assert v.allowed, v.message
    assert v.warnings == []


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.update(globalBatchSize=20),
     "spec.globalBatchSize 20 is not a multiple of spec.lanes 8; try 16 or 24"),
    (lambda s: s["recipe"]["sources"][0].update(uris=["data/web.parquet"]),
     "spec.recipe.sources[0].uris[0] 'data/web.parquet' is a relative path"),
    (lambda s: s["recipe"]["tokenizer"].update(uri="tok.json"),
     "spec.recipe.tokenizer.uri 'tok.json' is a relative path"),
    (lambda s: s["recipe"]["sources"][0].update(uris=["s3://d/web/a.csv"]),
     "spec.recipe.sources[0].uris[0] 's3://d/web/a.csv': the format cannot be inferred from "
     "'.csv'"),
    (lambda s: s["checkpoint"].update(uri="/mnt/ckpt"),
     "spec.checkpoint.endpoint is set, but spec.checkpoint.uri '/mnt/ckpt' is not an s3://"),
    (lambda s: s["checkpoint"].update(uri="ckpt/run"),
     "spec.checkpoint.uri 'ckpt/run' is a relative path"),
])
def test_semantic_errors_name_the_field_and_value(change, message) -> None:  # type: ignore[no-untyped-def]
    body = dp()
    change(body["spec"])
    v = review_pipeline(body)
    assert not v.allowed
    assert message in v.message, v.message


def test_formats_that_can_be_inferred_later_are_not_refused() -> None:
    body = dp()
    body["spec"]["recipe"]["sources"][0]["uris"] = ["s3://d/web/*", "s3://d/web/",
                                                    "s3://d/x.json.gz", "s3://d/y.ndjson"]
    assert review_pipeline(body).allowed
    body["spec"]["recipe"]["sources"][0]["format"] = "parquet"
    body["spec"]["recipe"]["sources"][0]["uris"] = ["s3://d/web/a.bin"]
    assert review_pipeline(body).allowed


def test_warnings_for_local_paths_missing_credentials_and_predicates() -> None:
    body = dp()
    body["spec"]["checkpoint"] = {"uri": "s3://ckpt/run"}
    body["spec"]["recipe"]["sources"][0]["uris"] = ["/data/web/*.parquet"]
    body["spec"]["recipe"]["filters"] = {"predicate": "mypkg.filters:keep"}
    # refused by default (test_policy.py); admitted under an administrator's policy
    policy = Policy(allow_operator_identity=True, predicate_modules=("mypkg",))
    v = review_pipeline(body, policy=policy)
    assert v.allowed, v.message
    text = "\n".join(v.warnings)
    assert "'/data/web/*.parquet' is a local path" in text
    assert "secretRef is not set" in text
    assert "'mypkg.filters:keep' must be importable" in text


def test_one_pipeline_per_workload() -> None:
    v = review_pipeline(dp(), others=[("pretrain", "llama"), ("other", "llama")])
    assert not v.allowed
    assert "spec.workload.name 'llama' is already the workload of DataPipeline 'other'" in (
        v.message)
    assert review_pipeline(dp(), others=[("pretrain", "llama"), ("x", "other-job")]).allowed


@pytest.mark.parametrize(("field", "value"), [
    ("lanes", 16), ("globalBatchSize", 32), ("workload", {"name": "other"}),
])
def test_run_defining_fields_are_fixed(field, value) -> None:  # type: ignore[no-untyped-def]
    old = dp()
    new = dp()
    new["spec"][field] = value
    v = review_pipeline(new, old)
    assert not v.allowed
    assert v.message.startswith(f"spec.{field} is fixed for the life of a run (")
    # knobs may change
    knob = dp()
    knob["spec"]["sidecar"]["workers"] = 8
    knob["spec"]["checkpoint"]["keep"] = 5
    assert review_pipeline(knob, old).allowed


def test_existing_workload_must_fit_the_lanes() -> None:
    v = review_pipeline(dp(), workload=job(workers=9))
    assert not v.allowed
    assert v.message == ("spec.lanes 8 does not fit PyTorchJob llama as it runs now: "
                         + ISSUE_MESSAGE)
    assert review_pipeline(dp(), workload=job(workers=4)).allowed
    assert review_pipeline(dp(), workload=job(workers=3)).allowed  # 2, 3 and 3 lanes
    unknown = review_pipeline(dp(), workload=job(workers=9, nproc="cpu", gpus=None))
    assert unknown.allowed and "scale guard is off" in unknown.warnings[0]


def test_dropped_nulls_from_client_side_apply_are_refused() -> None:
    body = dp()
    manifest = copy.deepcopy(body)
    manifest["spec"]["recipe"]["sources"][0]["epochs"] = None
    manifest["spec"]["recipe"]["sources"][0]["format"] = None
    body["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(manifest)}
    assert dropped_nulls(body) == []  # nothing defaulted yet
    body["spec"]["recipe"]["sources"][0]["epochs"] = 1  # the API server's default
    assert dropped_nulls(body) == ["spec.recipe.sources[0].epochs"]
    v = review_pipeline(body)
    assert not v.allowed
    assert v.message.startswith("spec.recipe.sources[0].epochs is null in your manifest, but "
                                "client-side `kubectl apply` drops null fields, so it would "
                                "get the default 1")


def test_scale_guard_uses_the_issue_message() -> None:
    v = review_scale(scale(9), job(workers=4), lanes=8, pipeline="pretrain")
    assert not v.allowed
    assert v.message == ISSUE_MESSAGE + " (DataPipeline pretrain)"
    for ok in (1, 2, 3, 4, 5, 6, 7, 8, 0):
        assert review_scale(scale(ok), job(workers=4), 8, "pretrain").allowed, ok
    bad = review_scale({"spec": {"replicas": -1}}, job(), 8, "pretrain")
    assert not bad.allowed and "spec.replicas -1" in bad.message


def test_scale_guard_counts_ranks_per_pod() -> None:
    assert review_scale(scale(3), job(workers=2, nproc="2"), lanes=8, pipeline="p").allowed
    v = review_scale(scale(5), job(workers=2, nproc="2"), lanes=8, pipeline="p")
    assert v.message == ("8 lanes cannot be split over 5 workers (world size 10: 5 pods x 2 "
                         "ranks); use 1 to 4 workers (DataPipeline p)")


def test_workload_updates_are_guarded_too() -> None:
    assert not review_workload(job(workers=9), 8, "p").allowed
    assert review_workload(job(workers=3), 8, "p").allowed
    unknown = review_workload(job(workers=9, nproc="gpu", gpus=None), 8, "p")
    assert unknown.allowed and "not checked" in unknown.warnings[0]


# ---- parallelism ---------------------------------------------------------------------------


def test_scale_guard_uses_the_data_parallel_world() -> None:
    tp2 = Parallelism(tensor=2)
    j = job(workers=2, nproc="2")  # 2 pods x 2 ranks, TP 2: DP 2
    v = review_scale(scale(9), j, lanes=8, pipeline="p", parallelism=tp2)
    assert not v.allowed
    assert v.message == ("8 lanes cannot be split over 9 workers (world size 18: 9 pods x 2 "
                         "ranks, TP 2 -> DP 9); use 1 to 8 workers (DataPipeline p)")
    # 8 workers: 16 ranks are more than 8 lanes, but DP 8 is not
    assert not review_scale(scale(8), j, 8, "p").allowed
    assert review_scale(scale(8), j, 8, "p", parallelism=tp2).allowed
    assert review_workload(job(workers=8, nproc="2"), 8, "p", parallelism=tp2).allowed
    assert review_workload(job(workers=3, nproc="2"), 8, "p", parallelism=tp2).allowed
    assert not review_workload(job(workers=9, nproc="2"), 8, "p", parallelism=tp2).allowed


def test_workload_ranks_must_be_whole_model_replicas() -> None:
    v = review_workload(job(workers=3, nproc="2"), 8, "p",
                        parallelism=Parallelism(tensor=2, pipeline=2))
    assert v.message == ("3 workers do not fit TP 2 x PP 2: world size 6 (3 pods x 2 ranks) is "
                         "not a multiple of TP 2 x PP 2 = 4; use 2, 4, 6, 8, 10, 12, 14 or 16 "
                         "workers (DataPipeline p)")


def test_pipeline_parallelism_is_checked_against_the_running_job() -> None:
    # 4 pods x 2 ranks = 8 ranks do not split 4 lanes; under TP 2 they are DP 4, which does
    assert not review_pipeline(dp(lanes=4, batch=16), workload=job(workers=4, nproc="2")).allowed
    assert review_pipeline(dp(lanes=4, batch=16, parallelism={"tensor": 2}),
                           workload=job(workers=4, nproc="2")).allowed
    v = review_pipeline(dp(parallelism={"tensor": 4}), workload=job(workers=2, nproc="2"))
    assert not v.allowed
    assert v.message == (
        "spec.lanes 8 and spec.parallelism (TP 4) do not fit PyTorchJob llama as it runs now: "
        "TP 4 must divide the 2 ranks per pod (nprocPerNode 2): the TP and CP peers of a "
        "data-parallel rank read one sidecar session, so they share a pod; use a multiple of 4 "
        "ranks per pod or change spec.parallelism")
    bad = review_pipeline(dp(parallelism={"tensor": 0}))
    assert not bad.allowed and "spec.parallelism.tensor 0 must be >= 1" in bad.message


def test_parallelism_may_change_between_restarts() -> None:
    """Not a run-defining field: the lanes' data does not depend on how ranks share them."""
    assert review_pipeline(dp(parallelism={"tensor": 2}), dp()).allowed


# ---- editing a running DataPipeline's recipe ---------------------------------------------

WARMUP = {"name": "warmup", "start_step": 100, "weights": {"web": 1.0}}
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 0.2, "code": 0.8},
          "ramp_steps": 50}


def running(phases: list[dict[str, object]], step: int | None = 350) -> dict[str, object]:
    """A stored DataPipeline with ``phases`` whose job has committed checkpoint ``step`` (the
    status says so too, but the webhook reads the progress from the store: ``review_edit``)."""
    body = dp()
    body["spec"]["recipe"]["phases"] = copy.deepcopy(phases)
    if step is not None:
        body["status"] = {"lastCommittedStep": step, "checkpoints": [step - 50, step]}
    return body


def review_edit(new: dict[str, object], old: dict[str, object], step: int | None = 350,
                **kw: object) -> Verdict:
    """``review_pipeline`` of an UPDATE whose run's store has committed up to ``step``."""
    return review_pipeline(new, old, progress=Progress(STORE, step), **kw)  # type: ignore[arg-type]


def edited(old: dict[str, object], phases: list[dict[str, object]],
           **recipe: object) -> dict[str, object]:
    new = copy.deepcopy(old)
    new["spec"]["recipe"]["phases"] = copy.deepcopy(phases)  # type: ignore[index]
    new["spec"]["recipe"].update(recipe)  # type: ignore[index]
    return new


def test_appending_a_phase_after_the_recorded_step_is_admitted() -> None:
    old = running([WARMUP])
    v = review_edit(edited(old, [WARMUP, ANNEAL]), old)
    assert v.allowed, v.message
    assert v.warnings == []  # no job yet: nothing serves the old recipe


def test_an_admitted_edit_says_when_the_running_pods_pick_it_up() -> None:
    old = running([WARMUP])
    v = review_edit(edited(old, [WARMUP, ANNEAL]), old, workload=job(workers=4))
    assert v.allowed, v.message
    assert v.warnings == [
        "spec.recipe edited (phase 'anneal' (from step 500) appended): the sidecars of "
        "PyTorchJob llama serve the recipe they started with until their pods restart; the "
        "operator restarts them when the job commits its next checkpoint (the newest is step "
        "350), before step 500, and they resume there under the new one; kubectl describe dp "
        "shows the condition PhaseRolled"]


def test_phases_starting_at_or_after_the_recorded_step_may_change_or_go() -> None:
    old = running([WARMUP, ANNEAL])
    later = {**ANNEAL, "start_step": 900, "weights": {"code": 1.0}}
    assert review_edit(edited(old, [WARMUP, later]), old).allowed  # changed
    assert review_edit(edited(old, [WARMUP]), old).allowed  # removed
    at = {**ANNEAL, "start_step": 350}  # nothing of it consumed: checkpoint 350 is before it
    assert review_edit(edited(old, [WARMUP, at]), old).allowed


def test_editing_a_consumed_phase_is_refused_with_the_reason() -> None:
    old = running([WARMUP])
    v = review_edit(edited(old, [{**WARMUP, "weights": {"web": 0.5}}, ANNEAL]), old)
    assert not v.allowed
    assert v.message == (
        "spec.recipe edits steps the run has already consumed (the newest checkpoint committed "
        "in s3://ckpt/run-1, step 350): "
        "phases[0] 'warmup' (starts at step 100, before the resume step 350): weights.web "
        "saved 1.0, now 0.5. Only phases that start at step 350 or later, and eval streams, "
        "may change on a running DataPipeline; create a new DataPipeline for a new run")


def test_a_phase_inserted_before_the_recorded_step_is_refused() -> None:
    old = running([WARMUP])
    v = review_edit(edited(old, [WARMUP, {**ANNEAL, "start_step": 349}]), old)
    assert not v.allowed
    assert ("phases[1] 'anneal' (starts at step 349, before the resume step 350): added"
            in v.message), v.message


def test_other_recipe_fields_are_fixed_once_a_checkpoint_is_recorded() -> None:
    old = running([WARMUP])
    v = review_edit(edited(old, [WARMUP], seed=6), old)
    assert not v.allowed
    assert "recipe.seed: saved 5, now 6" in v.message, v.message
    # before any checkpoint, a restart serves the run from step 0: any valid edit is admitted
    fresh = running([WARMUP], step=None)
    assert review_edit(edited(fresh, [{**WARMUP, "weights": {"web": 0.1}}], seed=6),
                       fresh, step=None).allowed
    # and an invalid one is still refused, for what it is
    bad = review_edit(edited(fresh, [WARMUP, {**WARMUP, "start_step": 50}]), fresh,
                      step=None)
    assert not bad.allowed and "phase names must be unique" in bad.message, bad.message


def test_eval_streams_may_change_on_a_running_pipeline() -> None:
    old = running([WARMUP])
    stream = {"name": "heldout", "steps": 4,
              "sources": [{"name": "val", "uris": ["s3://data/val/part-0.jsonl"]}]}
    new = edited(old, [WARMUP], eval=[stream])
    v = review_edit(new, old)
    assert v.allowed, v.message
    newer = copy.deepcopy(new)
    newer["spec"]["recipe"]["eval"][0]["steps"] = 8  # type: ignore[index]
    assert review_edit(newer, new).allowed


def test_a_stored_recipe_that_does_not_load_does_not_wedge_its_fix() -> None:
    old = running([WARMUP])
    old["spec"]["recipe"]["phases"][0]["weights"] = {"nope": 1.0}  # type: ignore[index]
    v = review_edit(edited(old, [WARMUP]), old)
    assert v.allowed, v.message
    assert v.warnings[0].startswith("the stored spec.recipe does not load (")


def test_the_edits_quoted_in_the_operator_guide_are_the_real_answers() -> None:
    """docs/operator.md "Editing a running DataPipeline": its example's warning and refusals."""
    import re
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operator.md").read_text()
    text = " ".join(doc.split())
    old = yaml.safe_load(re.findall(r'```yaml title="pretrain.yaml"\n(.*?)```', doc, re.S)[0])
    old["metadata"]["namespace"] = "ml"
    at = Progress(old["spec"]["checkpoint"]["uri"], 42000)  # the store's newest checkpoint
    new = copy.deepcopy(old)
    new["spec"]["recipe"]["phases"] = [{"name": "anneal", "start_step": 90000, "ramp_steps": 2000,
                                        "weights": {"web": 0.3, "code": 0.7}}]
    admitted = review_pipeline(new, old, workload=job(workers=8), progress=at)
    assert admitted.allowed and len(admitted.warnings) == 1
    assert f"Warning: {admitted.warnings[0]}" in text
    past = copy.deepcopy(new)
    past["spec"]["recipe"]["sources"][1]["weight"] = 0.3
    refused = review_pipeline(past, new, progress=at)
    assert not refused.allowed and f"denied the request: {refused.message}" in text
    early = copy.deepcopy(new)
    early["spec"]["recipe"]["phases"].insert(0, {"name": "warmup", "start_step": 1000,
                                                 "weights": {"web": 1.0}})
    refused = review_pipeline(early, new, progress=at)
    quoted = "phases[0] 'warmup' (starts at step 1000, before the resume step 42000): added"
    assert quoted in refused.message and quoted in text


def test_rank_processes_is_checked_and_may_change_on_a_running_pipeline() -> None:
    v = review_pipeline(dp(sidecar={"rankProcesses": "all"}))
    assert not v.allowed
    assert "spec.sidecar.rankProcesses must be integer or 'auto', got 'all'" in v.message
    old = dp()
    for value in (2, "auto", 0):  # a knob: the pods get it when they are next created
        assert review_pipeline(dp(sidecar={"rankProcesses": value}), old).allowed, value

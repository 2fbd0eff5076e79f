"""Rolling an edited recipe into a running job: the pods are stamped with the
recipe they serve, and the pure reconcile restarts those serving an older one at the right
checkpoint. Hand-worked orderings of the committed steps against the phase's start."""

from __future__ import annotations

import copy
from typing import Any

from datalane_operator.inject import mutate_pod
from datalane_operator.names import ANN_RECIPE
from datalane_operator.pipeline import Pipeline, load_pipeline
from datalane_operator.reconcile import decide
from datalane_operator.rollout import Stamp, plan_roll, stamp_of
from datalane_operator.storage import Listing

from .builders import RECIPE, dp, job, pod

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
WARMUP = {"name": "warmup", "start_step": 100, "weights": {"web": 1.0}, "ramp_steps": 1}
ANNEAL = {"name": "anneal", "start_step": 500, "weights": {"web": 0.2, "code": 0.8},
          "ramp_steps": 50}
OLD = load_pipeline(dp(recipe={**copy.deepcopy(RECIPE), "phases": [WARMUP]}))
NEW_BODY = dp(recipe={**copy.deepcopy(RECIPE), "phases": [WARMUP, ANNEAL]})
NEW_BODY["metadata"]["generation"] = 2
NEW = load_pipeline(NEW_BODY)
WHO = "2 pods serving an older recipe (llama-worker-0, llama-worker-1)"
ANNEALING = "phase 'anneal' (from step 500)"


def pods_of(pipeline: Pipeline, n: int = 2) -> list[dict[str, Any]]:
    return [mutate_pod(pod(f"llama-worker-{i}", phase="Running"), pipeline, "img:1")
            for i in range(n)]


def roll(committed: list[int] | None, previous_step: int | None,
         previous: dict[str, Any] | None = None, pods: list[dict[str, Any]] | None = None,
         ) -> tuple[tuple[bool, str, str] | None, tuple[str, ...]]:
    r = plan_roll(stamp_of(NEW.recipe), pods_of(OLD) if pods is None else pods, committed,
                  previous_step, previous)
    return r.condition, r.restart


def test_the_pod_webhook_stamps_the_recipe_and_the_stamp_names_the_first_difference() -> None:
    (p,) = pods_of(OLD, 1)
    stamp = Stamp.parse(p["metadata"]["annotations"][ANN_RECIPE])
    assert stamp == stamp_of(OLD.recipe)
    assert [(n, s) for n, s, _ in stamp.phases] == [("warmup", 100)]
    assert stamp.first_difference(stamp_of(NEW.recipe)) == (500, "anneal")  # appended
    moved = load_pipeline(dp(recipe={**copy.deepcopy(RECIPE), "phases": [
        WARMUP, {**ANNEAL, "start_step": 700}]}))
    assert stamp_of(NEW.recipe).first_difference(stamp_of(moved.recipe)) == (500, "anneal")
    retuned = load_pipeline(dp(recipe={**copy.deepcopy(RECIPE), "phases": [
        WARMUP, {**ANNEAL, "weights": {"web": 0.5, "code": 0.5}}]}))
    assert stamp_of(NEW.recipe).first_difference(stamp_of(retuned.recipe)) == (500, "anneal")
    assert stamp_of(NEW.recipe).first_difference(stamp_of(OLD.recipe)) == (500, "anneal")
    evals = load_pipeline(dp(recipe={**copy.deepcopy(RECIPE), "phases": [WARMUP, ANNEAL],
                                     "eval": [{"name": "held", "steps": 2, "sources": [{"name": "h",
                                               "uris": ["s3://data/held.parquet"]}]}]}))
    assert stamp_of(evals.recipe).digest != stamp_of(NEW.recipe).digest
    assert stamp_of(NEW.recipe).first_difference(stamp_of(evals.recipe)) is None
    assert mutate_pod(p, OLD, "img:1") == p  # idempotent, stamp included


def test_nothing_to_roll() -> None:
    assert roll([300, 350], 350, pods=pods_of(NEW)) == (None, ())  # every pod current
    assert plan_roll(stamp_of(NEW.recipe), [pod("llama-worker-0", phase="Running")],
                     [350], 350, None).condition is None  # unstamped pods are left alone


def test_a_fresh_checkpoint_before_the_phase_restarts_the_pods_there() -> None:
    # edit seen at 350 (not fresh): the next checkpoint, about 400, is before 500: wait
    assert roll([300, 350], 350) == ((False, "WaitingForCheckpoint",
                                      f"{WHO}: restarting them at the next checkpoint committed "
                                      f"(the newest is step 350), so that they resume under the "
                                      f"recipe with {ANNEALING}"), ())
    # step 400 committed since the last reconcile: restart now, they resume at 400
    assert roll([300, 350, 400], 350) == (
        (False, "RestartingPods", f"restarting {WHO} at step 400 (the newest checkpoint): they "
                                  f"resume there under the recipe with {ANNEALING}"),
        ("llama-worker-0", "llama-worker-1"))


def test_when_the_next_checkpoint_would_pass_the_phase_the_pods_restart_at_once() -> None:
    # every 100 steps, the newest 450 already seen: the next (550) would be past 500
    condition, restart = roll([350, 450], 450)
    assert restart == ("llama-worker-0", "llama-worker-1")
    assert condition == (False, "RestartingPods",
                         f"restarting {WHO} at step 450 (the newest checkpoint; the next, about "
                         f"step 550, would come after step 500): they resume there under the "
                         f"recipe with {ANNEALING}")
    # one checkpoint only (step 300 from 0): the next about 600, past 500
    assert roll([300], 300)[1] == ("llama-worker-0", "llama-worker-1")
    # exactly at the phase's start: a resume at 500 is allowed, the next (600) is not
    assert roll([400, 500], 500)[1] == ("llama-worker-0", "llama-worker-1")
    # every 50 steps at 400: the next, 450, is still before 500: wait
    assert roll([350, 400], 400)[0][1] == "WaitingForCheckpoint"  # type: ignore[index]


def test_no_checkpoint_yet_restarts_from_the_start() -> None:
    assert roll([], None) == ((False, "RestartingPods",
                               f"restarting {WHO} before any checkpoint: the job starts over "
                               f"under the recipe with {ANNEALING}"),
                              ("llama-worker-0", "llama-worker-1"))


def test_a_store_not_looked_at_yet_restarts_nothing() -> None:
    # a new leader whose status was lost: it does not know whether a checkpoint exists
    condition, restart = roll(None, None)
    assert (condition, restart) == ((False, "WaitingForCheckpoint",
                                     f"{WHO}: waiting for a look at the checkpoint store, to "
                                     f"restart them at a checkpoint so that they resume under "
                                     f"the recipe with {ANNEALING}"), ())
    assert decide(NEW, job(workers=2), pods_of(OLD), None, {}, T0).restart == ()
    # with the previous status's checkpoints (none committed), the job starts over
    assert decide(NEW, job(workers=2), pods_of(OLD), None, {"checkpoints": []}, T0).restart == (
        "llama-worker-0", "llama-worker-1")


def test_a_checkpoint_past_the_phase_is_too_late() -> None:
    condition, restart = roll([450, 550], 450)
    text = (f"step 550 was committed by {WHO} after {ANNEALING} began: a resume under the "
            f"current recipe is refused, so the pods were not restarted and keep the old one; "
            f"no edit can fix spec.recipe now (edits are checked against it): recreate the "
            f"DataPipeline with what changed starting at step 550 or later")
    assert (condition, restart) == ((False, "CheckpointPastPhase", text), ())


def test_only_live_stale_pods_are_restarted_and_the_condition_settles() -> None:
    pods = pods_of(OLD, 3)
    pods[1] = pods_of(NEW, 2)[1]  # recreated already
    pods[2]["metadata"]["deletionTimestamp"] = T0  # going
    condition, restart = roll([300, 400], 300, pods=pods)
    assert restart == ("llama-worker-0",)
    assert condition is not None and condition[1] == "RestartingPods"
    # the next reconcile: every live pod current; the message keeps where they restarted
    previous = {"type": "PhaseRolled", "status": "False", "reason": "RestartingPods",
                "message": condition[2]}
    assert roll([300, 400], 400, previous, pods_of(NEW)) == (
        (True, "PodsCurrent", "restarted 1 pods serving an older recipe (llama-worker-0) at "
                              f"step 400 (the newest checkpoint): they resume there under the "
                              f"recipe with {ANNEALING}"), ())


def test_decide_carries_the_roll_into_status_events_and_degraded() -> None:
    listing = Listing("s3://c", [300, 350])
    first = decide(NEW, job(workers=2), pods_of(OLD), listing, None, T0)
    # the first look at the store (no previous status) counts as a fresh checkpoint
    assert first.restart == ("llama-worker-0", "llama-worker-1")
    waiting = decide(NEW, job(workers=2), pods_of(OLD), listing,
                     {"lastCommittedStep": 350}, T0)
    assert waiting.restart == ()
    rolled = next(c for c in waiting.status["conditions"] if c["type"] == "PhaseRolled")
    assert (rolled["status"], rolled["reason"], rolled["observedGeneration"]) == (
        "False", "WaitingForCheckpoint", 2)
    now = decide(NEW, job(workers=2), pods_of(OLD), Listing("s3://c", [300, 350, 400]),
                 waiting.status, T1)
    assert now.restart == ("llama-worker-0", "llama-worker-1")
    assert [e.reason for e in now.events] == ["Checkpointed", "RestartingPods"]
    assert now.events[1].message.startswith(f"restarting {WHO} at step 400")
    late = decide(NEW, job(workers=2), pods_of(OLD), Listing("s3://c", [450, 550]),
                  waiting.status, T1)
    assert late.restart == () and late.status["phase"] == "Degraded"
    degraded = next(c for c in late.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CheckpointPastPhase")
    # a finished job is never restarted
    done = job(workers=2)
    done["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    assert decide(NEW, done, pods_of(OLD), Listing("s3://c", [300, 400]),
                  waiting.status, T1).restart == ()
    # no edit, no condition: the status of a job that was never edited is unchanged
    plain = decide(OLD, job(workers=2), pods_of(OLD), listing, None, T0)
    assert [c["type"] for c in plain.status["conditions"]] == ["Ready", "Degraded"]

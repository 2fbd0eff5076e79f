"""Reconcile decisions: status from the world, conditions, events."""

from __future__ import annotations

from typing import Any

from datalane_operator.inject import mutate_pod
from datalane_operator.pipeline import load_pipeline
from datalane_operator.reconcile import MAX_LISTED_CHECKPOINTS, decide, decide_invalid
from datalane_operator.storage import Listing

from .builders import dp, job, pod

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
PIPE = load_pipeline(dp())


def running_pods(n: int, injected: bool = True) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        p = pod(f"llama-worker-{i}", phase="Running")
        out.append(mutate_pod(p, PIPE, "img:1") if injected else p)
    return out


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    (c,) = [c for c in status["conditions"] if c["type"] == ctype]
    return c


def test_no_workload_yet() -> None:
    d = decide(PIPE, None, [], None, None, T0)
    s = d.status
    assert s["phase"] == "Pending"
    assert cond(s, "Ready")["status"] == "False"
    assert cond(s, "Ready")["reason"] == "WorkloadNotFound"
    assert cond(s, "Degraded")["status"] == "False"
    # the ConfigMap of this recipe: 16 hex digits of the SHA-256 of the canonical recipe
    assert s["observedGeneration"] == 1
    assert s["recipeConfigMap"] == "pretrain-recipe-66693d1a8e29c782"
    assert "worldSize" not in s and d.events == []


def test_running_job_with_checkpoints() -> None:
    d = decide(PIPE, job(workers=4), running_pods(4), Listing("s3://c", [2, 4, 6]), None, T0)
    s = d.status
    assert s["phase"] == "Running"
    assert (s["pods"], s["readyPods"], s["ranksPerPod"], s["worldSize"], s["lanesPerRank"]) == (
        4, 4, 1, 4, 2)
    assert (s["lastCommittedStep"], s["checkpoints"]) == (6, [2, 4, 6])
    ready = cond(s, "Ready")
    assert (ready["status"], ready["reason"], ready["lastTransitionTime"]) == (
        "True", "AllPodsReady", T0)
    assert [(e.type, e.reason) for e in d.events] == [("Normal", "WorkloadObserved"),
                                                      ("Normal", "Checkpointed")]
    assert "world size 4 (4 pods x 1 ranks, 2 lanes per rank)" in d.events[0].message
    # nothing changed: same status (transition times kept), no events
    again = decide(PIPE, job(workers=4), running_pods(4), Listing("s3://c", [2, 4, 6]), s, T1)
    assert again.status == s and again.events == [] and not again.changed(s)


def test_rescale_updates_world_and_emits_an_event() -> None:
    before = decide(PIPE, job(workers=4), running_pods(4), Listing("u", [6]), None, T0).status
    d = decide(PIPE, job(workers=2), running_pods(4)[:2], None, before, T1)
    assert (d.status["worldSize"], d.status["lanesPerRank"]) == (2, 4)
    assert d.status["lastCommittedStep"] == 6  # kept from the last look at the store
    assert [e.reason for e in d.events] == ["Rescaled"]
    assert d.events[0].message == "world size 4 -> 2 (2 pods x 1 ranks, 4 lanes per rank)"


def test_scaling_to_a_world_that_does_not_divide_the_lanes_reports_the_imbalance() -> None:
    before = decide(PIPE, job(workers=4), running_pods(4), None, None, T0).status
    d = decide(PIPE, job(workers=3), running_pods(3), None, before, T1)
    assert (d.status["phase"], d.status["worldSize"], d.status["lanesPerRank"]) == (
        "Running", 3, "2-3")
    assert cond(d.status, "Degraded")["status"] == "False"
    assert d.events[0].message == "world size 4 -> 3 (3 pods x 1 ranks, 2-3 lanes per rank)"


def test_starting_while_pods_are_not_ready() -> None:
    pods = running_pods(4)
    pods[3]["status"]["phase"] = "Pending"
    d = decide(PIPE, job(workers=4), pods, None, None, T0)
    assert d.status["phase"] == "Starting"
    assert cond(d.status, "Ready")["message"] == "3 of 4 pods ready"


def test_pods_without_sidecar_degrade() -> None:
    pods = running_pods(2) + running_pods(4, injected=False)[2:]
    d = decide(PIPE, job(workers=4), pods, None, None, T0)
    deg = cond(d.status, "Degraded")
    assert (d.status["phase"], deg["status"], deg["reason"]) == (
        "Degraded", "True", "SidecarMissing")
    assert "llama-worker-2, llama-worker-3" in deg["message"]
    warnings = [e for e in d.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["SidecarMissing"]


def test_world_size_mismatch_and_recovery() -> None:
    bad = decide(PIPE, job(workers=9), running_pods(9), None, None, T0)
    deg = cond(bad.status, "Degraded")
    assert deg["reason"] == "WorldSizeMismatch"
    assert deg["message"] == "8 lanes cannot be split over 9 workers; use 1 to 8"
    assert "lanesPerRank" not in bad.status and bad.status["worldSize"] == 9
    good = decide(PIPE, job(workers=2), running_pods(2), None, bad.status, T1)
    assert cond(good.status, "Degraded")["status"] == "False"
    assert [e.reason for e in good.events] == ["Rescaled", "Recovered"]
    assert cond(good.status, "Degraded")["lastTransitionTime"] == T1


def test_unknown_ranks_per_pod_degrades() -> None:
    d = decide(PIPE, job(workers=2, nproc="cpu", gpus=None), running_pods(2), None, None, T0)
    assert cond(d.status, "Degraded")["reason"] == "RanksPerPodUnknown"
    assert "worldSize" not in d.status


def test_storage_errors_keep_the_last_known_checkpoints() -> None:
    before = decide(PIPE, job(), running_pods(4), Listing("u", [4, 6]), None, T0).status
    d = decide(PIPE, job(), running_pods(4), Listing("s3://ckpt/run-1", error="OSError: 403"),
               before, T1)
    assert d.status["checkpoints"] == [4, 6] and d.status["lastCommittedStep"] == 6
    deg = cond(d.status, "Degraded")
    assert deg["reason"] == "StorageUnavailable"
    assert deg["message"] == "cannot list s3://ckpt/run-1: OSError: 403"


def test_checkpoint_list_is_bounded_and_gc_is_reported() -> None:
    steps = list(range(0, 200, 2))
    d = decide(PIPE, job(), running_pods(4), Listing("u", steps, deleted=[0, 2]), None, T0)
    assert d.status["checkpoints"] == steps[-MAX_LISTED_CHECKPOINTS:]
    gc = [e for e in d.events if e.reason == "CheckpointsCollected"]
    assert gc[0].message == "deleted steps 0, 2; keeping the newest 2 committed"


def test_finished_jobs() -> None:
    done = job()
    done["status"] = {"conditions": [{"type": "Running", "status": "False"},
                                     {"type": "Succeeded", "status": "True"}]}
    d = decide(PIPE, done, [], None, None, T0)
    assert d.status["phase"] == "Succeeded"
    assert cond(d.status, "Ready")["reason"] == "WorkloadSucceeded"
    assert cond(d.status, "Degraded")["status"] == "False"


def test_invalid_spec() -> None:
    d = decide_invalid("x", 3, "spec.lanes must be an integer", {"checkpoints": [1]}, T0)
    assert d.status["phase"] == "Degraded" and d.status["checkpoints"] == [1]
    assert cond(d.status, "Degraded")["reason"] == "InvalidSpec"
    assert d.events[0].type == "Warning"


# ---- parallelism ---------------------------------------------------------------------------

TP2 = load_pipeline(dp(parallelism={"tensor": 2}))


def tp_pods(n: int) -> list[dict[str, Any]]:
    return [mutate_pod(pod(f"llama-worker-{i}", nproc="2", gpus=2, nnodes=str(n),
                           phase="Running"), TP2, "img:1") for i in range(n)]


def test_status_of_a_tensor_parallel_job_is_the_dp_world() -> None:
    d = decide(TP2, job(workers=2, nproc="2"), tp_pods(2), None, None, T0)
    s = d.status
    # 2 pods x 2 ranks = 4 ranks, TP 2: DP 2, 8 lanes / 2 = 4 lanes per DP rank
    assert (s["pods"], s["ranksPerPod"], s["ranks"], s["readersPerDataRank"], s["worldSize"],
            s["lanesPerRank"], s["phase"]) == (2, 2, 4, 2, 2, 4, "Running")
    assert d.events[0].message == ("PyTorchJob llama: data-parallel world size 2 (2 pods x 2 "
                                   "ranks, TP 2 -> DP 2, 4 lanes per rank)")
    before = decide(TP2, job(workers=4, nproc="2"), tp_pods(4), None, None, T0).status
    assert (before["worldSize"], before["lanesPerRank"]) == (4, 2)
    after = decide(TP2, job(workers=2, nproc="2"), tp_pods(2), None, before, T1)
    assert [e.message for e in after.events] == [
        "data-parallel world size 4 -> 2 (2 pods x 2 ranks, TP 2 -> DP 2, 4 lanes per rank)"]


def test_ranks_that_do_not_fit_the_parallelism_degrade() -> None:
    pipe = load_pipeline(dp(parallelism={"tensor": 2, "pipeline": 2}))
    d = decide(pipe, job(workers=3, nproc="2"), [], None, None, T0)
    deg = cond(d.status, "Degraded")
    assert deg["reason"] == "ParallelismMismatch"
    assert deg["message"].startswith("3 workers do not fit TP 2 x PP 2: world size 6")
    assert "worldSize" not in d.status and d.status["ranks"] == 6
    plain = decide(PIPE, job(workers=5, nproc="2"), [], None, None, T0)  # 10 ranks, 8 lanes
    assert cond(plain.status, "Degraded")["reason"] == "WorldSizeMismatch"

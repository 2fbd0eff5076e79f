"""PyTorchJob topology and the scale guard's message."""

from __future__ import annotations

import pytest
from datalane_operator.pipeline import Parallelism
from datalane_operator.workload import (
    Topology,
    check_workers,
    lanes_per_rank,
    nproc_of_container,
    topology_of,
    valid_worker_counts,
)

from datalane.spec.errors import ConfigError

from .builders import job


def gpus(n: int | None = None, cpu: str | None = None) -> dict[str, object]:
    limits: dict[str, str] = {}
    if n is not None:
        limits["nvidia.com/gpu"] = str(n)
    if cpu is not None:
        limits["cpu"] = cpu
    return {"name": "pytorch", "resources": {"limits": limits}}


@pytest.mark.parametrize(("setting", "container", "expected"), [
    ("1", gpus(8), 1), ("4", None, 4), (2, None, 2), (None, gpus(8), 8), ("auto", gpus(4), 4),
    ("gpu", gpus(2), 2), ("gpu", gpus(), None), ("cpu", gpus(cpu="16"), 16),
    ("cpu", gpus(cpu="500m"), None), ("auto", gpus(cpu="3"), 3), ("auto", gpus(), None),
    ("0", None, None), ("many", None, None),
])
def test_nproc_resolution(setting, container, expected) -> None:  # type: ignore[no-untyped-def]
    n, why = nproc_of_container(setting, container)
    assert n == expected
    assert why  # always explains itself


def test_topology_counts_every_replica_type() -> None:
    t = topology_of(job(workers=3, master=1, nproc="2"))
    assert (t.pods, t.workers, t.others, t.nproc, t.ranks, t.dp_size) == (4, 3, 1, 2, 8, 8)
    assert topology_of(job(workers=4, nproc=None, gpus=8)).dp_size == 32
    deprecated = job(workers=2, nproc=None)
    deprecated["spec"]["elasticPolicy"] = {"nProcPerNode": 4}
    assert topology_of(deprecated).nproc == 4


def test_any_world_size_up_to_the_lanes_is_accepted() -> None:
    t = topology_of(job(workers=4, nproc="1"))
    for workers in range(1, 9):  # 3, 5, 6 and 7 do not divide 8: accepted all the same
        check_workers(8, t, workers=workers)
    assert valid_worker_counts(8, t) == [1, 2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(ConfigError) as e:
        check_workers(8, t, workers=9)
    assert str(e.value) == "8 lanes cannot be split over 9 workers; use 1 to 8"


def test_lanes_per_rank_reports_the_imbalance() -> None:
    assert [lanes_per_rank(8, w) for w in (1, 2, 3, 4, 5, 7, 8)] == [
        8, 4, "2-3", 2, "1-2", "1-2", 1]
    assert lanes_per_rank(64, 7) == "9-10"


def test_message_with_a_master_and_several_ranks_per_pod() -> None:
    t = topology_of(job(workers=4, master=1, nproc="2"))  # world 10
    assert valid_worker_counts(16, t) == [1, 2, 3, 4, 5, 6, 7]  # (1+w)*2 <= 16
    check_workers(16, t)
    assert valid_worker_counts(8, t) == [1, 2, 3]
    with pytest.raises(ConfigError) as e:
        check_workers(8, t)
    assert str(e.value) == ("8 lanes cannot be split over 4 workers (world size 10: 5 pods x 2 "
                            "ranks); use 1 to 3 workers")


def test_no_worker_count_works() -> None:
    t = topology_of(job(workers=1, master=1, nproc="5"))  # 10 ranks at least
    with pytest.raises(ConfigError, match="no worker count works with 1 other pods and 5 ranks"):
        check_workers(8, t)


def test_zero_workers_is_a_stopped_job_and_unknown_nproc_is_not_checked() -> None:
    check_workers(8, topology_of(job(workers=4)), workers=0)
    check_workers(8, topology_of(job(workers=3, nproc="cpu", gpus=None)))


# ---- parallelism: only the data-parallel world divides the lanes ---------------------------


def tp(tensor: int = 1, pipeline: int = 1, context: int = 1) -> Parallelism:
    return Parallelism(tensor=tensor, pipeline=pipeline, context=context)


def refusal(lanes: int, t: Topology, workers: int | None = None) -> str:
    with pytest.raises(ConfigError) as e:
        check_workers(lanes, t, workers)
    return str(e.value)


def test_tensor_parallel_job_has_a_smaller_data_parallel_world() -> None:
    t = topology_of(job(workers=2, nproc="2"), parallelism=tp(2))
    # 2 pods x 2 ranks = 4 ranks; TP 2 -> DP 2; each pod holds 1 DP rank read by 2 TP peers
    assert (t.ranks, t.dp_size, t.dp_ranks_per_pod) == (4, 2, 1)
    check_workers(8, t)
    check_workers(2, t)  # 2 lanes split over DP 2 (the 4 ranks would not split them)
    with pytest.raises(ConfigError):
        check_workers(2, topology_of(job(workers=2, nproc="2")))


def test_scale_to_nine_tensor_parallel_workers_names_the_dp_size() -> None:
    t = topology_of(job(workers=2, nproc="2"), parallelism=tp(2))
    assert valid_worker_counts(8, t) == list(range(1, 9))  # w pods x 2 ranks / TP 2 = DP w
    check_workers(8, t, workers=3)  # DP 3 of 8 lanes: ranks of 2, 3 and 3 lanes
    assert refusal(8, t, workers=9) == (
        "8 lanes cannot be split over 9 workers (world size 18: 9 pods x 2 ranks, TP 2 -> DP 9); "
        "use 1 to 8 workers")


def test_a_master_counts_in_the_dp_world_too() -> None:
    t = topology_of(job(workers=8, master=1, nproc="2"), parallelism=tp(2))
    assert valid_worker_counts(8, t) == list(range(1, 8))  # (1 + w) x 2 / 2 <= 8
    assert refusal(8, t) == ("8 lanes cannot be split over 8 workers (world size 18: 9 pods x 2 "
                             "ranks, TP 2 -> DP 9); use 1 to 7 workers")


def test_tp_times_cp_must_divide_the_ranks_per_pod() -> None:
    t = topology_of(job(workers=2, nproc="2"), parallelism=tp(2, context=2))
    assert t.dp_ranks_per_pod is None and valid_worker_counts(8, t) == []
    assert refusal(8, t) == (
        "TP 2 x CP 2 = 4 must divide the 2 ranks per pod (nprocPerNode 2): the TP and CP peers "
        "of a data-parallel rank read one sidecar session, so they share a pod; use a "
        "multiple of 4 ranks per pod or change spec.parallelism")
    # 4 ranks per pod hold one TP x CP group each: 2 pods -> DP 2
    fits = topology_of(job(workers=2, nproc="4"), parallelism=tp(2, context=2))
    assert (fits.dp_size, fits.dp_ranks_per_pod) == (2, 1)
    check_workers(8, fits)


def test_pipeline_parallel_world_must_hold_whole_model_replicas() -> None:
    t = topology_of(job(workers=2, nproc="2"), parallelism=tp(2, pipeline=2))
    # 2 pods x 2 ranks = 4 = one replica of TP 2 x PP 2: DP 1
    assert (t.ranks, t.dp_size, t.dp_ranks_per_pod) == (4, 1, 1)
    check_workers(8, t)
    # DP d needs 4d ranks = 2d pods: 2, 4, ..., 16 workers for DP 1 to 8
    assert valid_worker_counts(8, t) == [2, 4, 6, 8, 10, 12, 14, 16]
    assert refusal(8, t, workers=3) == (
        "3 workers do not fit TP 2 x PP 2: world size 6 (3 pods x 2 ranks) is not a multiple of "
        "TP 2 x PP 2 = 4; use 2, 4, 6, 8, 10, 12, 14 or 16 workers")


def test_pods_must_not_span_pipeline_stages() -> None:
    # 8 ranks per pod, TP 2 x PP 2: a stage has world/2 ranks; one pod of 8 would hold both
    t = topology_of(job(workers=2, nproc="8"), parallelism=tp(2, pipeline=2))
    assert (t.ranks, t.dp_size, t.dp_ranks_per_pod) == (16, 4, 4)  # a pod: 4 DP ranks, 1 stage
    check_workers(8, t)
    assert valid_worker_counts(8, t) == [2, 4]  # DP 4 and DP 8; DP 2 (1 pod) spans stages
    assert refusal(8, t, workers=1) == (
        "1 worker does not fit TP 2 x PP 2: a pipeline stage has 4 ranks (world size 8 / PP 2), "
        "fewer than the 8 ranks of a pod, so a pod would hold ranks of several stages; use 2 "
        "or 4 workers")


def test_no_worker_count_works_under_the_parallelism() -> None:
    # a Master and 3 ranks per pod under PP 3: DP = 1 + w, a stage has 1 + w ranks, which
    # must be a multiple of 3 (whole pods) while 1 + w <= 2 lanes: never
    t = topology_of(job(workers=1, master=1, nproc="3"), parallelism=tp(pipeline=3))
    assert refusal(2, t) == (
        "1 worker does not fit PP 3: a pipeline stage has 2 ranks (world size 6 / PP 3), fewer "
        "than the 3 ranks of a pod, so a pod would hold ranks of several stages; no worker "
        "count works with 1 other pods and 3 ranks per pod under PP 3")

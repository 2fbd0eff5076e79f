"""PyTorchJob topology and the scale guard's message."""

from __future__ import annotations

import pytest
from datalane_operator.workload import (
    check_workers,
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
    assert (t.pods, t.workers, t.others, t.nproc, t.world_size) == (4, 3, 1, 2, 8)
    assert topology_of(job(workers=4, nproc=None, gpus=8)).world_size == 32
    deprecated = job(workers=2, nproc=None)
    deprecated["spec"]["elasticPolicy"] = {"nProcPerNode": 4}
    assert topology_of(deprecated).nproc == 4


def test_the_issue_message_for_plain_workers() -> None:
    t = topology_of(job(workers=4, nproc="1"))
    check_workers(8, t)  # 4 divides 8
    with pytest.raises(ConfigError) as e:
        check_workers(8, t, workers=3)
    assert str(e.value) == "8 lanes cannot be split over 3 workers; use 1, 2, 4 or 8"


def test_message_with_a_master_and_several_ranks_per_pod() -> None:
    t = topology_of(job(workers=2, master=1, nproc="2"))  # world 6
    assert valid_worker_counts(16, t) == [1, 3, 7]  # (1+w)*2 divides 16
    with pytest.raises(ConfigError) as e:
        check_workers(16, t)
    assert str(e.value) == ("16 lanes cannot be split over 2 workers (world size 6: 3 pods x 2 "
                            "ranks); use 1, 3 or 7 workers")


def test_no_worker_count_works() -> None:
    t = topology_of(job(workers=1, master=1, nproc="3"))
    with pytest.raises(ConfigError, match="no worker count works with 1 other pods and 3 ranks"):
        check_workers(8, t)


def test_zero_workers_is_a_stopped_job_and_unknown_nproc_is_not_checked() -> None:
    check_workers(8, topology_of(job(workers=4)), workers=0)
    check_workers(8, topology_of(job(workers=3, nproc="cpu", gpus=None)))

"""Which data-parallel rank a process reads: mesh, explicit numbers, the operator's env."""

from __future__ import annotations

import pytest

from datalane import ConfigError
from datalane.client.dataparallel import DataParallel, resolve

ENV = ("RANK", "WORLD_SIZE", "DATALANE_DP_SIZE", "DATALANE_DP_READERS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


class FakeMesh:
    """The two methods of a 1-D DeviceMesh that resolve() reads (plus its shape)."""

    def __init__(self, rank: int, size: int, ndim: int = 1) -> None:
        self.ndim, self._rank, self._size = ndim, rank, size
        self.mesh_dim_names = ("dp", "tp")[:ndim]

    def get_local_rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def test_torchrun_env_is_pure_data_parallelism(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolve() == DataParallel(5, 8, 1, 0)


@pytest.mark.parametrize(("rank", "expected"), [
    # 16 ranks, TP 2 innermost, DP 4, PP 2 outermost: rank = (RANK // 2) % 4, reader RANK % 2
    (0, DataParallel(0, 4, 2, 0)), (1, DataParallel(0, 4, 2, 1)),
    (2, DataParallel(1, 4, 2, 0)), (7, DataParallel(3, 4, 2, 1)),
    (8, DataParallel(0, 4, 2, 0)), (13, DataParallel(2, 4, 2, 1)),
])
def test_operator_env_under_tp_and_pp(monkeypatch, rank, expected) -> None:
    for k, v in {"RANK": rank, "WORLD_SIZE": 16, "DATALANE_DP_SIZE": 4,
                 "DATALANE_DP_READERS": 2}.items():
        monkeypatch.setenv(k, str(v))
    assert resolve() == expected


def test_a_mesh_wins_over_the_global_rank(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    assert resolve(mesh=FakeMesh(1, 2), readers=2) == DataParallel(1, 2, 2, 1)
    with pytest.raises(ConfigError, match=r"mesh has 2 dimensions \('dp', 'tp'\); pass its "
                                          r"data-parallel sub-mesh, e.g. mesh\['dp'\]"):
        resolve(mesh=FakeMesh(0, 2, ndim=2))
    with pytest.raises(ConfigError, match="either mesh= or rank=/world_size="):
        resolve(1, 2, mesh=FakeMesh(1, 2))


def test_explicit_numbers_and_their_refusals(monkeypatch) -> None:
    assert resolve(1, 4, readers=2, reader=1) == DataParallel(1, 4, 2, 1)
    with pytest.raises(ConfigError, match=r"reader 2 is outside 0\.\.1 for 2 readers"):
        resolve(0, 1, readers=2, reader=2)
    with pytest.raises(ConfigError, match="readers must be at least 1, got 0"):
        resolve(0, 1, readers=0)
    with pytest.raises(ConfigError, match=r"rank 4 is outside 0\.\.3 for world size 4"):
        resolve(4, 4)
    with pytest.raises(ConfigError, match="rank not given"):
        resolve()


def test_an_env_that_does_not_describe_the_job_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("DATALANE_DP_READERS", "2")
    with pytest.raises(ConfigError, match=r"DATALANE_DP_READERS is 2 but the data-parallel "
                                          r"world size is unknown"):
        resolve()
    monkeypatch.setenv("DATALANE_DP_SIZE", "4")
    with pytest.raises(ConfigError, match=r"\$WORLD_SIZE 6 is not a multiple of "
                                          r"\$DATALANE_DP_SIZE 4 x 2 readers"):
        resolve()

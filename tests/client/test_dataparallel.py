"""Which data-parallel rank a process reads: mesh, explicit numbers, the operator's env."""

from __future__ import annotations

import dataclasses

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
    assert resolve(0, 1) == DataParallel(0, 1, 1, 0)  # the smallest world: one rank
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


def test_an_empty_env_variable_is_unset_and_a_non_integer_one_is_refused(monkeypatch) -> None:
    """$RANK="" (a templated pod spec) counts as unset: explicit numbers decide; a value that
    is not an integer is refused naming the variable and the value."""
    monkeypatch.setenv("RANK", "")
    monkeypatch.setenv("WORLD_SIZE", "")
    assert resolve(2, 3) == DataParallel(2, 3, 1, 0)
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ConfigError, match=r"^\$RANK is 'one', not an integer$"):
        resolve(2, 3)


def test_the_reader_defaults_to_the_global_rank_modulo_the_readers(monkeypatch) -> None:
    """Without $RANK the reader is 0; with it, RANK % readers (RANK 5 of readers 2: reader 1;
    of readers 3: reader 2); an explicit reader wins."""
    assert resolve(1, 4, readers=2) == DataParallel(1, 4, 2, 0)
    monkeypatch.setenv("RANK", "5")
    assert resolve(1, 4, readers=2) == DataParallel(1, 4, 2, 1)
    assert resolve(1, 4, readers=3) == DataParallel(1, 4, 3, 2)
    assert resolve(1, 4, readers=3, reader=0) == DataParallel(1, 4, 3, 0)


def test_an_explicit_rank_wins_over_the_operators_env(monkeypatch) -> None:
    """$DATALANE_DP_SIZE gives the world size; a rank passed in is kept, not derived from
    $RANK (RANK 6 with 2 readers would be rank 3)."""
    for k, v in {"RANK": 6, "WORLD_SIZE": 8, "DATALANE_DP_SIZE": 4,
                 "DATALANE_DP_READERS": 2}.items():
        monkeypatch.setenv(k, str(v))
    assert resolve() == DataParallel(3, 4, 2, 0)
    assert resolve(rank=1) == DataParallel(1, 4, 2, 0)


def test_the_operators_env_without_world_size_or_with_one_reader(monkeypatch) -> None:
    """No $WORLD_SIZE: nothing to check $DATALANE_DP_SIZE against, it is taken; one reader
    declared without $DATALANE_DP_SIZE is pure data parallelism ($WORLD_SIZE)."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("DATALANE_DP_SIZE", "2")
    assert resolve() == DataParallel(1, 2, 1, 0)
    monkeypatch.delenv("DATALANE_DP_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("DATALANE_DP_READERS", "1")
    assert resolve() == DataParallel(3, 4, 1, 0)


def test_readers_without_the_data_parallel_size_are_refused_not_taken_as_ranks(
        monkeypatch) -> None:
    """Under torchrun alone ($RANK 3 of $WORLD_SIZE 4) with 2 readers given, the peers 2 and 3
    of one data-parallel rank would each take a rank of their own (other lanes): refused,
    naming how the readers were given. With the data-parallel size known, rank 1 of 2."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match=r"^readers= 2 but the data-parallel world size is "
                                          r"unknown \(no \$DATALANE_DP_SIZE"):
        resolve(readers=2)
    monkeypatch.setenv("DATALANE_DP_READERS", "4")  # (the argument wins, and is named)
    with pytest.raises(ConfigError, match=r"^readers= 2 but"):
        resolve(readers=2)
    with pytest.raises(ConfigError, match=r"^\$DATALANE_DP_READERS is 4 but"):
        resolve()
    monkeypatch.delenv("DATALANE_DP_READERS")
    assert resolve(readers=1) == DataParallel(3, 4, 1, 0)
    monkeypatch.setenv("DATALANE_DP_SIZE", "2")
    assert resolve(readers=2) == DataParallel(1, 2, 2, 1)


def test_a_mesh_with_only_a_rank_or_only_a_world_size_is_refused() -> None:
    for args in ({"rank": 1}, {"world_size": 2}):
        with pytest.raises(ConfigError, match="either mesh= or rank=/world_size="):
            resolve(mesh=FakeMesh(1, 2), **args)


def test_a_missing_world_size_is_named(monkeypatch) -> None:
    """$RANK without $WORLD_SIZE: the error names world_size (not rank)."""
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"^world_size not given: pass rank= and world_size="):
        resolve()


@pytest.mark.parametrize(("args", "message"), [
    ((True, 2), r"^rank must be an integer, got True$"),
    ((0, 2.0), r"^world size must be an integer, got 2\.0$"),
    ((0, 0), r"^world size must be a positive integer, got 0$"),
    ((-1, 4), r"^rank -1 is outside 0\.\.3 for world size 4$"),
])
def test_explicit_numbers_of_the_wrong_kind_or_range_are_refused(args, message) -> None:
    """rank and world size are ints (not bools or floats), 1 <= world size, 0 <= rank < it."""
    with pytest.raises(ConfigError, match=message):
        resolve(*args)


def test_readers_and_reader_must_be_integers() -> None:
    """readers=2.0 or reader=True are refused by name, not truncated or taken as 1."""
    with pytest.raises(ConfigError, match=r"^readers must be an integer, got 2\.0$"):
        resolve(0, 1, readers=2.0)
    with pytest.raises(ConfigError, match=r"^reader must be an integer, got True$"):
        resolve(0, 1, readers=2, reader=True)
    with pytest.raises(ConfigError, match=r"^reader -1 is outside 0\.\.1 for 2 readers$"):
        resolve(0, 1, readers=2, reader=-1)


def test_a_mesh_must_be_a_device_mesh() -> None:
    """Anything without ndim and get_local_rank is refused naming its type."""
    with pytest.raises(ConfigError, match=r"^mesh must be a torch DeviceMesh, got object$"):
        resolve(mesh=object())

    class NoRank:
        ndim = 1

    with pytest.raises(ConfigError, match=r"^mesh must be a torch DeviceMesh, got NoRank$"):
        resolve(mesh=NoRank())
    assert resolve(mesh=FakeMesh(2, 3)) == DataParallel(2, 3, 1, 0)


def test_a_resolved_rank_is_an_immutable_value() -> None:
    """What resolve() returns is frozen (the loaders keep it): hashable, no assignment."""
    dp = resolve(1, 4)
    assert hash(dp) == hash(DataParallel(1, 4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        dp.rank = 2  # type: ignore[misc]

"""Lane math (which rank owns which lanes) and the counter-based permutation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datalane.engine.rng import permutation
from datalane.spec import ConfigError
from datalane.spec.lanes import (
    RankShape,
    check_world_size,
    lanes_of_rank,
    microbatch_sizes,
    microbatches_per_step,
    nearest_multiples,
    rank_of_lane,
    rank_shape,
    valid_world_sizes,
)


def error_of(fn: object, *args: object) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)  # type: ignore[operator]
    return str(info.value)


# -- lanes_of_rank --------------------------------------------------------------------------------


def test_lanes_of_rank_examples() -> None:
    assert [list(lanes_of_rank(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lanes_of_rank(8, 1, 0) == range(0, 8)
    assert [lanes_of_rank(8, 8, r) for r in range(8)] == [range(r, r + 1) for r in range(8)]
    assert lanes_of_rank(12, 3, 2) == range(8, 12)


@given(st.integers(1, 96), st.data())
def test_ranks_own_contiguous_disjoint_lanes_covering_all(lanes: int, data: st.DataObject) -> None:
    world = data.draw(st.sampled_from(valid_world_sizes(lanes)))
    owned = [lanes_of_rank(lanes, world, r) for r in range(world)]
    assert [lane for rng in owned for lane in rng] == list(range(lanes))  # in rank order
    for r, rng in enumerate(owned):
        assert rng.step == 1
        assert len(rng) == lanes // world
        assert all(rank_of_lane(lanes, world, lane) == r for lane in rng)


@given(st.integers(1, 64), st.data())
def test_every_world_size_splits_lanes_along_the_same_boundaries(
        lanes: int, data: st.DataObject) -> None:
    # A rank of a smaller world owns exactly the union of consecutive ranks of a larger one:
    # the global batch (lanes in order) is the same concatenation for every world size.
    large = data.draw(st.sampled_from(valid_world_sizes(lanes)))
    small = data.draw(st.sampled_from(valid_world_sizes(large)))
    ratio = large // small
    for r in range(small):
        merged = [lane for k in range(r * ratio, (r + 1) * ratio)
                  for lane in lanes_of_rank(lanes, large, k)]
        assert merged == list(lanes_of_rank(lanes, small, r))


def test_rank_out_of_range() -> None:
    assert error_of(lanes_of_rank, 8, 4, 4) == "rank 4 is outside 0..3 for world size 4"
    assert error_of(lanes_of_rank, 8, 4, -1) == "rank -1 is outside 0..3 for world size 4"
    assert error_of(lanes_of_rank, 8, 2, True) == "rank True is outside 0..1 for world size 2"
    assert error_of(lanes_of_rank, 8, 2, "0") == "rank '0' is outside 0..1 for world size 2"


def test_lanes_of_rank_checks_the_world_size_first() -> None:
    assert error_of(lanes_of_rank, 8, 9, 0) == (
        "8 lanes cannot be split over 9 ranks (a rank owns at least one lane); use a world "
        "size of 1 to 8")


def test_uneven_worlds_split_contiguously_by_floor() -> None:
    # floor(r*8/3) = 0, 2, 5, 8: sizes 2, 3, 3
    assert [lanes_of_rank(8, 3, r) for r in range(3)] == [range(0, 2), range(2, 5),
                                                         range(5, 8)]
    # floor(r*8/5) = 0, 1, 3, 4, 6, 8
    assert [len(lanes_of_rank(8, 5, r)) for r in range(5)] == [1, 2, 1, 2, 2]
    assert [lanes_of_rank(8, 7, r).start for r in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    assert lanes_of_rank(8, 7, 6) == range(6, 8)
    assert [rank_of_lane(8, 3, k) for k in range(8)] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert [rank_of_lane(8, 5, k) for k in range(8)] == [0, 1, 1, 2, 3, 3, 4, 4]
    assert error_of(rank_of_lane, 8, 3, 8) == "lane 8 is outside 0..7"


def test_rank_of_lane_checks_the_world_size_first() -> None:
    """rank_of_lane refuses a world it cannot split (not rank -1 for W=0, nor a rank past the
    last for W > L), with the world-size error every lane function gives."""
    assert error_of(rank_of_lane, 8, 0, 3) == "world size must be a positive integer, got 0"
    assert error_of(rank_of_lane, 8, 9, 0) == (
        "8 lanes cannot be split over 9 ranks (a rank owns at least one lane); use a world "
        "size of 1 to 8")


# -- world sizes ----------------------------------------------------------------------------------


def test_check_world_size_refuses_more_ranks_than_lanes_naming_the_lanes() -> None:
    assert error_of(check_world_size, 8, 16) == (
        "8 lanes cannot be split over 16 ranks (a rank owns at least one lane); use a world "
        "size of 1 to 8")
    assert error_of(check_world_size, 1, 2) == (
        "1 lanes cannot be split over 2 ranks (a rank owns at least one lane); use a world "
        "size of 1 to 1")


@pytest.mark.parametrize("bad", [0, -4, 2.0, "2", None, True])
def test_world_size_must_be_a_positive_integer(bad: object) -> None:
    assert error_of(check_world_size, 8, bad) == (
        f"world size must be a positive integer, got {bad!r}")


@pytest.mark.parametrize("lanes", [1, 2, 7, 8, 12, 64])
def test_check_world_size_accepts_one_to_the_lane_count(lanes: int) -> None:
    for world in range(1, lanes + 1):
        check_world_size(lanes, world)
    for world in (lanes + 1, lanes + 2):
        with pytest.raises(ConfigError):
            check_world_size(lanes, world)


# -- microbatches per step ------------------------------------------------------------------------


def test_rank_shape_pads_the_ranks_with_fewer_lanes() -> None:
    # 8 lanes, B=32 (4 sequences a lane), W=3: ranks own 2, 3, 3 lanes; m=2 -> 6 microbatches
    assert [rank_shape(8, 32, 3, r, 2) for r in range(3)] == [
        RankShape(range(0, 2), 4, 6), RankShape(range(2, 5), 6, 6), RankShape(range(5, 8), 6, 6)]
    assert rank_shape(8, 32, 3, 0, 2).padded == 2
    # divisor worlds: no padding, B/W/m as before
    assert rank_shape(8, 32, 4, 1, 2) == RankShape(range(2, 4), 4, 4)
    assert microbatches_per_step(32, 4, 2, 8) == 4
    assert microbatches_per_step(32, 4, 2) == 4  # the old form: B/W/m
    # W=4 of 8 lanes with B=32: local batch 8, so m=8 serves it; at W=3 only divisors of 4
    assert rank_shape(8, 32, 4, 0, 8) == RankShape(range(0, 2), 1, 1)
    assert microbatch_sizes(8, 32, 3) == [1, 2, 4]
    assert microbatch_sizes(8, 32, 4) == [1, 2, 4, 8]
    assert microbatch_sizes(8, 64, 8) == [1, 2, 4, 8]


def test_microbatch_sizes_checks_the_world_size_first() -> None:
    """microbatch_sizes of a world with more ranks than lanes is the world-size error, not an
    empty list (a rank of no lanes would have a local batch of 0)."""
    assert error_of(microbatch_sizes, 8, 32, 9) == (
        "8 lanes cannot be split over 9 ranks (a rank owns at least one lane); use a world "
        "size of 1 to 8")
    assert error_of(microbatch_sizes, 8, 32, 0) == "world size must be a positive integer, got 0"


def test_microbatches_per_step_of_a_single_rank() -> None:
    """A world of one rank yields the whole global batch: B/m microbatches a step (its only
    rank is rank 0), with or without the lane count."""
    assert microbatches_per_step(32, 1, 4) == 8
    assert microbatches_per_step(32, 1, 4, 8) == 8
    assert microbatches_per_step(32, 1, 32, 8) == 1


def test_a_rank_shape_is_an_immutable_value() -> None:
    """A RankShape is frozen (shared by every caller that asks for it): hashable, equal by
    value, and refusing assignment."""
    shape = rank_shape(8, 32, 3, 0, 2)
    assert hash(shape) == hash(RankShape(range(0, 2), 4, 6))
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.real = 6  # type: ignore[misc]


def test_a_microbatch_size_that_cannot_serve_the_world_is_refused_naming_those_that_can() -> None:
    assert error_of(rank_shape, 8, 32, 3, 0, 8) == (
        "microbatch size 8 does not divide the local batch of 8 or 12 sequences (B=32, L=8, "
        "W=3); use one of [1, 2, 4]")
    assert error_of(rank_shape, 8, 32, 4, 0, 3) == (
        "microbatch size 3 does not divide the local batch of 8 sequences (B=32, L=8, W=4); "
        "use one of [1, 2, 4, 8]")
    assert error_of(rank_shape, 8, 32, 4, 0, 0).startswith("microbatch size 0 does not")


@given(st.integers(1, 64), st.integers(1, 8), st.data())
def test_any_world_size_owns_every_lane_once_with_equal_microbatch_counts(
        lanes: int, lane_batch: int, data: st.DataObject) -> None:
    world = data.draw(st.integers(1, lanes), label="world")
    batch = lanes * lane_batch
    owned = [lanes_of_rank(lanes, world, r) for r in range(world)]
    assert [lane for rng in owned for lane in rng] == list(range(lanes))  # once, in rank order
    for r, rng in enumerate(owned):
        assert rng.step == 1
        assert len(rng) in (lanes // world, -(-lanes // world))
        assert all(rank_of_lane(lanes, world, lane) == r for lane in rng)
    sizes = microbatch_sizes(lanes, batch, world)
    assert 1 in sizes
    m = data.draw(st.integers(1, 2 * lane_batch * -(-lanes // world)), label="m")
    if m not in sizes:
        with pytest.raises(ConfigError):
            rank_shape(lanes, batch, world, 0, m)
        return
    shapes = [rank_shape(lanes, batch, world, r, m) for r in range(world)]
    total = -(-lanes // world) * lane_batch // m
    assert {s.total for s in shapes} == {total}
    for s in shapes:
        assert s.real * m == len(s.lanes) * lane_batch  # the real ones hold the rank's rows
        assert s.padded == (-(-lanes // world) - len(s.lanes)) * lane_batch // m
    if lanes % world:  # non-divisor: exactly the divisors of the lane batch
        assert sizes == [d for d in range(1, lane_batch + 1) if lane_batch % d == 0]


def test_valid_world_sizes_are_the_divisors() -> None:
    assert valid_world_sizes(1) == [1]
    assert valid_world_sizes(8) == [1, 2, 4, 8]
    assert valid_world_sizes(12) == [1, 2, 3, 4, 6, 12]
    assert valid_world_sizes(13) == [1, 13]
    assert valid_world_sizes(64) == [1, 2, 4, 8, 16, 32, 64]


def test_nearest_multiples() -> None:
    assert nearest_multiples(100, 8) == [96, 104]
    assert nearest_multiples(4, 8) == [8]
    assert nearest_multiples(17, 16) == [16, 32]


# -- permutation ----------------------------------------------------------------------------------


@given(st.integers(0, 300), st.integers(0, 2**63), st.text(max_size=8), st.integers(0, 50))
def test_permutation_is_a_deterministic_permutation(
        n: int, seed: int, name: str, epoch: int) -> None:
    perm = permutation(n, seed, "chunks", name, epoch)
    assert sorted(perm) == list(range(n))
    assert permutation(n, seed, "chunks", name, epoch) == perm


@settings(max_examples=50)
@given(st.integers(20, 200), st.integers(0, 10**6))
def test_permutation_depends_on_every_part_of_the_key(n: int, seed: int) -> None:
    base = permutation(n, seed, "block", "web", 3, 1, 0)
    variants = [
        permutation(n, seed + 1, "block", "web", 3, 1, 0),
        permutation(n, seed, "chunks", "web", 3, 1, 0),
        permutation(n, seed, "block", "code", 3, 1, 0),
        permutation(n, seed, "block", "web", 4, 1, 0),
        permutation(n, seed, "block", "web", 3, 2, 0),
        permutation(n, seed, "block", "web", 3, 1, 1),
    ]
    # With n >= 20 a collision has probability below 1/20! per pair.
    for v in variants:
        assert v != base


def test_permutation_key_parts_are_not_concatenated_ambiguously() -> None:
    assert permutation(50, 1, 23) != permutation(50, 12, 3)
    assert permutation(50, "ab", "c") != permutation(50, "a", "bc")


def test_permutation_is_pinned() -> None:
    # The stream of every lane depends on these values: changing the generator changes every
    # recipe's data, so it must be deliberate (and the golden hashes updated with it).
    assert permutation(10, 0, "chunks", "web", 0) == [0, 4, 3, 8, 7, 5, 2, 9, 6, 1]
    assert permutation(12, 1234, "chunks", "web", 0) == [7, 8, 6, 3, 11, 2, 10, 1, 4, 0, 9, 5]
    assert permutation(0, 1) == []
    assert permutation(1, 1) == [0]


def test_permutation_is_not_the_identity_and_mixes_well() -> None:
    # Over many keys every element lands in every slot: no position is stuck.
    n = 8
    seen: list[set[int]] = [set() for _ in range(n)]
    for seed in range(200):
        for slot, value in enumerate(permutation(n, seed, "mix")):
            seen[slot].add(value)
    assert all(s == set(range(n)) for s in seen)
    assert sum(permutation(n, s, "mix") == list(range(n)) for s in range(200)) <= 2


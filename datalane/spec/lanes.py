"""Lane math: which rank owns which lanes, and what a step window is.

See docs/architecture.md, Trainers, ranks and readers.

Pure functions of ``(lanes, world_size, rank)``; the loader, the sidecar, the clients and the
operator's scale guard all call these, so the split can never disagree between components.

Any world size ``1 <= W <= L`` works: rank ``r`` owns the contiguous lanes
``[floor(r*L/W), floor((r+1)*L/W))`` - ``floor(L/W)`` or ``ceil(L/W)`` of them - which is
``[r*L/W, (r+1)*L/W)`` when W divides L. The global batch is every lane's window in lane order
whoever computes it, so it is the same for every W. So that the optimizer steps together on
every rank, each rank yields the same number of microbatches per step,
``ceil(L/W) * (B/L) / m``: a rank with ``floor(L/W)`` lanes yields its real microbatches, then
fully padded ones (:func:`rank_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass

from datalane.spec.errors import ConfigError

__all__ = [
    "RankShape",
    "check_world_size",
    "lanes_of_rank",
    "microbatch_sizes",
    "microbatches_per_step",
    "nearest_multiples",
    "rank_of_lane",
    "rank_shape",
    "valid_world_sizes",
]


def valid_world_sizes(lanes: int) -> list[int]:
    """Every data-parallel world size that splits ``lanes`` evenly (the divisors)."""
    return [w for w in range(1, lanes + 1) if lanes % w == 0]


def check_world_size(lanes: int, world_size: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= world_size <= lanes``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world size must be a positive integer, got {world_size!r}")
    if world_size > lanes:
        raise ConfigError(f"{lanes} lanes cannot be split over {world_size} ranks (a rank "
                          f"owns at least one lane); use a world size of 1 to {lanes}")


def lanes_of_rank(lanes: int, world_size: int, rank: int) -> range:
    """The contiguous lanes ``[floor(r*L/W), floor((r+1)*L/W))`` that rank ``rank`` of
    ``world_size`` owns (``floor(L/W)`` or ``ceil(L/W)`` of them)."""
    check_world_size(lanes, world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank!r} is outside 0..{world_size - 1} for world size "
                          f"{world_size}")
    return range(rank * lanes // world_size, (rank + 1) * lanes // world_size)


def rank_of_lane(lanes: int, world_size: int, lane: int) -> int:
    """The rank that owns ``lane`` under ``world_size``: the inverse of :func:`lanes_of_rank`
    (the last rank ``r`` with ``floor(r*L/W) <= lane``)."""
    check_world_size(lanes, world_size)
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < lanes:
        raise ConfigError(f"lane {lane!r} is outside 0..{lanes - 1}")
    return ((lane + 1) * world_size - 1) // lanes


def nearest_multiples(value: int, of: int) -> list[int]:
    """The multiples of ``of`` just below and above ``value`` (positive ones only)."""
    below = (value // of) * of
    out = [m for m in (below, below + of) if m > 0 and m != value]
    return out or [of]


def _lane_counts(lanes: int, world_size: int) -> list[int]:
    """The distinct numbers of lanes a rank of ``world_size`` owns (one or two)."""
    return sorted({lanes // world_size, -(-lanes // world_size)})


def microbatch_sizes(lanes: int, global_batch_size: int, world_size: int) -> list[int]:
    """The microbatch sizes that can serve ``world_size``: those dividing the local batch of
    every rank (``(B/L) * n`` for each lane count ``n`` a rank has; for a world size that does
    not divide the lanes that means the divisors of ``B/L``)."""
    check_world_size(lanes, world_size)
    lane_batch = global_batch_size // lanes
    locals_ = [lane_batch * n for n in _lane_counts(lanes, world_size)]
    return [m for m in range(1, min(locals_) + 1) if all(x % m == 0 for x in locals_)]


@dataclass(frozen=True)
class RankShape:
    """What one rank yields per step."""

    lanes: range  # the lanes it owns
    real: int  # microbatches holding its lanes' sequences (the first ones of the step)
    total: int  # microbatches per step, the same on every rank; the last total - real are
    #             fully padded

    @property
    def padded(self) -> int:
        return self.total - self.real


def rank_shape(lanes: int, global_batch_size: int, world_size: int, rank: int,
               microbatch_size: int) -> RankShape:
    """Lanes, real microbatches and total microbatches per step of rank ``rank``: every rank
    yields ``ceil(L/W) * (B/L) / m`` microbatches; ConfigError (naming the sizes that can)
    when ``microbatch_size`` cannot serve ``world_size``."""
    owned = lanes_of_rank(lanes, world_size, rank)
    lane_batch = global_batch_size // lanes
    m = microbatch_size
    if isinstance(m, bool) or not isinstance(m, int) or m < 1 or any(
            (lane_batch * n) % m for n in _lane_counts(lanes, world_size)):
        counts = _lane_counts(lanes, world_size)
        local = " or ".join(str(lane_batch * n) for n in counts)
        raise ConfigError(f"microbatch size {m!r} does not divide the local batch of {local} "
                          f"sequences (B={global_batch_size}, L={lanes}, W={world_size}); use "
                          f"one of {microbatch_sizes(lanes, global_batch_size, world_size)}")
    return RankShape(owned, len(owned) * lane_batch // m,
                     -(-lanes // world_size) * lane_batch // m)


def microbatches_per_step(global_batch_size: int, world_size: int, microbatch_size: int,
                          lanes: int | None = None) -> int:
    """How many microbatches of ``microbatch_size`` sequences every rank yields per step
    (``lanes`` omitted: a world size that divides the lanes, the local batch ``B/W``)."""
    if lanes is None:
        lanes = world_size  # B/W per rank: the same count as any L that W divides
    return rank_shape(lanes, global_batch_size, world_size, 0, microbatch_size).total

"""Lane math: which rank owns which lanes, and what a step window is (DESIGN section 2).

Pure functions of ``(lanes, world_size, rank)``; the loader, the sidecar and the operator's
scale guard all call these, so the split can never disagree between components.
"""

from __future__ import annotations

from datalane.spec.errors import ConfigError

__all__ = [
    "check_world_size",
    "microbatches_per_step",
    "lanes_of_rank",
    "nearest_multiples",
    "rank_of_lane",
    "valid_world_sizes",
]


def valid_world_sizes(lanes: int) -> list[int]:
    """Every data-parallel world size that splits ``lanes`` evenly (the divisors)."""
    return [w for w in range(1, lanes + 1) if lanes % w == 0]


def _or_list(values: list[int]) -> str:
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def check_world_size(lanes: int, world_size: int) -> None:
    """Raise :class:`ConfigError` unless ``world_size`` divides ``lanes``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world size must be a positive integer, got {world_size!r}")
    if lanes % world_size:
        raise ConfigError(
            f"{lanes} lanes cannot be split over {world_size} ranks; "
            f"use {_or_list(valid_world_sizes(lanes))}"
        )


def lanes_of_rank(lanes: int, world_size: int, rank: int) -> range:
    """The contiguous lanes ``[r*L/W, (r+1)*L/W)`` that rank ``rank`` of ``world_size`` owns."""
    check_world_size(lanes, world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank!r} is outside 0..{world_size - 1} for world size "
                          f"{world_size}")
    per = lanes // world_size
    return range(rank * per, (rank + 1) * per)


def rank_of_lane(lanes: int, world_size: int, lane: int) -> int:
    """The rank that owns ``lane`` under ``world_size``."""
    check_world_size(lanes, world_size)
    return lane // (lanes // world_size)


def nearest_multiples(value: int, of: int) -> list[int]:
    """The multiples of ``of`` just below and above ``value`` (positive ones only)."""
    below = (value // of) * of
    out = [m for m in (below, below + of) if m > 0 and m != value]
    return out or [of]


def microbatches_per_step(global_batch_size: int, world_size: int, microbatch_size: int) -> int:
    """How many microbatches of ``microbatch_size`` sequences make a rank's local batch."""
    local = global_batch_size // world_size
    if microbatch_size < 1 or local % microbatch_size:
        options = [d for d in range(1, local + 1) if local % d == 0]
        raise ConfigError(f"microbatch size {microbatch_size} does not divide the local batch "
                          f"of {local} sequences (B={global_batch_size}, W={world_size}); use "
                          f"one of {options}")
    return local // microbatch_size

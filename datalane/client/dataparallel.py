"""Which data-parallel rank a trainer process reads, and how many processes read it with it.

Lanes are dealt to *data-parallel* ranks. Under tensor, context or pipeline parallelism the
global rank is not the data-parallel rank: the tensor-parallel peers of a data-parallel rank
must receive the same batch, and they read it through one sidecar session as its
``readers`` (each with a ``reader`` index). This module resolves the four numbers, in order:

1. a ``DeviceMesh`` of the data-parallel dimension (``mesh=world_mesh["dp"]`` in TorchTitan):
   its local rank and size;
2. explicit ``rank`` and ``world_size`` (the data-parallel ones);
3. the environment: ``$DATALANE_DP_SIZE`` and ``$DATALANE_DP_READERS`` (injected by the
   operator for a DataPipeline that declares its parallelism) with torchrun's ``$RANK``, under
   the layout of TorchTitan and Megatron-LM (tensor and context parallelism innermost, pipeline
   outermost): ``rank = (RANK // readers) % dp_size``, ``reader = RANK % readers``;
4. torchrun's ``$RANK`` and ``$WORLD_SIZE`` (pure data parallelism: refused with more than one
   reader, whose peers would each take a rank, and other lanes, of their own).

Callers: :class:`~datalane.client.SidecarLoader`, :class:`~datalane.client.InProcessLoader`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from datalane.spec.errors import ConfigError

__all__ = ["DataParallel", "resolve"]


@dataclass(frozen=True)
class DataParallel:
    rank: int
    """The data-parallel rank: which lanes this process reads."""
    world_size: int
    """The data-parallel world size (1 to the lane count)."""
    readers: int = 1
    """Processes that read this data-parallel rank through one sidecar (TP/CP peers)."""
    reader: int = 0
    """This process's index among them."""


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"${name} is {raw!r}, not an integer") from None


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    return value


def _from_mesh(mesh: Any) -> tuple[int, int]:
    ndim = getattr(mesh, "ndim", None)
    if ndim is None or not hasattr(mesh, "get_local_rank"):
        raise ConfigError(f"mesh must be a torch DeviceMesh, got {type(mesh).__name__}")
    if ndim != 1:
        names = getattr(mesh, "mesh_dim_names", None) or ()
        raise ConfigError(f"mesh has {ndim} dimensions {tuple(names)}; pass its data-parallel "
                          f"sub-mesh, e.g. mesh['dp'] (TorchTitan flattens dp_replicate x "
                          f"dp_shard into 'dp')")
    return int(mesh.get_local_rank()), int(mesh.size())


def _from_env(rank: int | None, world_size: int | None, global_rank: int | None,
              readers: int, env_readers: bool) -> tuple[int, int]:
    dp_size = _env_int("DATALANE_DP_SIZE")
    world = _env_int("WORLD_SIZE")
    if dp_size is not None and world_size is None:
        if world is not None and world % (dp_size * readers):
            raise ConfigError(f"$WORLD_SIZE {world} is not a multiple of $DATALANE_DP_SIZE "
                              f"{dp_size} x {readers} readers: the pod's environment does "
                              f"not describe this job; pass mesh= or rank=/world_size=")
        world_size = dp_size
        if rank is None and global_rank is not None:
            rank = (global_rank // readers) % dp_size
    if world_size is None:
        # torchrun's numbers are the data-parallel ones only without peers: with readers,
        # $RANK would give each peer a rank of its own, other lanes
        if readers > 1:
            given = "$DATALANE_DP_READERS is" if env_readers else "readers="
            raise ConfigError(f"{given} {readers} but the data-parallel world size is unknown "
                              f"(no $DATALANE_DP_SIZE, e.g. an elastic job): pass mesh= or "
                              f"rank=/world_size=")
        world_size = world
    if rank is None:
        rank = global_rank
    if rank is None or world_size is None:
        missing = "rank" if rank is None else "world_size"
        raise ConfigError(f"{missing} not given: pass rank= and world_size= (the data-parallel "
                          f"ones) or mesh=, or run under torchrun ($RANK, $WORLD_SIZE)")
    return rank, world_size


def resolve(rank: int | None = None, world_size: int | None = None, *, mesh: Any = None,
            readers: int | None = None, reader: int | None = None) -> DataParallel:
    """The data-parallel rank, world size, readers and reader of this process."""
    if mesh is not None and (rank is not None or world_size is not None):
        raise ConfigError("pass either mesh= or rank=/world_size=, not both")
    global_rank = _env_int("RANK")
    env_readers = readers is None and _env_int("DATALANE_DP_READERS") is not None
    if readers is None:
        readers = _env_int("DATALANE_DP_READERS") or 1
    readers = _int(readers, "readers")
    if readers < 1:
        raise ConfigError(f"readers must be at least 1, got {readers}")
    if reader is None:
        reader = global_rank % readers if global_rank is not None else 0
    reader = _int(reader, "reader")
    if not 0 <= reader < readers:
        raise ConfigError(f"reader {reader} is outside 0..{readers - 1} for {readers} readers")
    if mesh is not None:
        rank, world_size = _from_mesh(mesh)
    elif rank is None or world_size is None:
        rank, world_size = _from_env(rank, world_size, global_rank, readers, env_readers)
    rank, world_size = _int(rank, "rank"), _int(world_size, "world size")
    if world_size < 1:
        raise ConfigError(f"world size must be a positive integer, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside 0..{world_size - 1} for world size "
                          f"{world_size}")
    return DataParallel(rank, world_size, readers, reader)

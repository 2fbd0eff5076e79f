"""datalane: the data a model is trained on, independent of how many GPUs train it.

Public API::

    from datalane import Knobs, Loader, load_recipe

    recipe = load_recipe("recipe.yaml")
    with Loader(recipe, rank=0, world_size=2, knobs=Knobs(workers=4)) as loader:
        for step in loader:            # numpy arrays of the rank's local batch
            ...
        state = loader.state_dict()    # JSON-serializable; restore with load_state_dict

The engine is imported lazily so that ``datalane.spec`` users (the operator, trainers with
only the client extra) do not need pyarrow or tokenizers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datalane.spec import (
    Checkpoint,
    ConfigError,
    DataError,
    DatalaneError,
    Knobs,
    LaneState,
    MismatchError,
    Recipe,
    StorageError,
    lanes_of_rank,
    load_recipe,
    merge_checkpoints,
    valid_world_sizes,
)
from datalane.spec.distribution import VERSION

if TYPE_CHECKING:
    from datalane.engine import Loader, Microbatch, Plan, Step

__version__ = VERSION

__all__ = [
    "Checkpoint",
    "ConfigError",
    "DataError",
    "DatalaneError",
    "Knobs",
    "LaneState",
    "Loader",
    "Microbatch",
    "MismatchError",
    "Plan",
    "Recipe",
    "Step",
    "StorageError",
    "lanes_of_rank",
    "load_recipe",
    "merge_checkpoints",
    "valid_world_sizes",
]


def __getattr__(name: str) -> Any:
    if name in {"Loader", "Microbatch", "Plan", "Step"}:
        from datalane import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'datalane' has no attribute {name!r}")

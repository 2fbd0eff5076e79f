"""The contract shared by every datalane component: recipe, knobs, lane math, fingerprints,
persisted-state schemas and the canonical batch hash. Standard library, numpy and typing only;
the operator imports this package without the engine."""

from datalane.spec.errors import (
    ConfigError,
    DataError,
    DatalaneError,
    MismatchError,
    StorageError,
)
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import check_world_size, lanes_of_rank, valid_world_sizes
from datalane.spec.recipe import Recipe, load_recipe, recipe_schema
from datalane.spec.state import Checkpoint, LaneState, merge_checkpoints

__all__ = [
    "Checkpoint",
    "ConfigError",
    "DataError",
    "DatalaneError",
    "Knobs",
    "LaneState",
    "MismatchError",
    "Recipe",
    "StorageError",
    "check_world_size",
    "lanes_of_rank",
    "load_recipe",
    "merge_checkpoints",
    "recipe_schema",
    "valid_world_sizes",
]

"""Knobs: settings that change speed and memory, never a byte of output (docs/recipe.md).

The world size and rank are knobs too, but they are passed to the loader directly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from datalane.spec import model
from datalane.spec.errors import ConfigError
from datalane.spec.model import doc

__all__ = ["Knobs"]


@dataclass(frozen=True)
class Knobs:
    """Performance settings of a loader or sidecar."""

    workers: int = doc("Threads running the map stages (decode, filter, tokenize), shared by "
                       "every lane in the process.", default=2, ge=1, le=256)
    map_processes: int = doc("Child processes running the map stages instead of `workers` "
                             "threads (0: threads of this process). Each has its own "
                             "interpreter lock, so decoding, chat template renders and "
                             "tokenizing use more cores than one lock allows; each holds a "
                             "copy of the recipe's tokenizers and templates "
                             "(docs/architecture.md, Map processes).",
                             default=0, ge=0, le=256)
    prefetch: int = doc("Map tasks in flight per lane and source (backpressure bound).",
                        default=8, ge=1, le=1024)
    task_docs: int = doc("Documents per map task (one batched tokenizer call); a stream's "
                         "first tasks are smaller and double up to this.",
                         default=256, ge=1, le=65536)
    image_bytes: int = doc("Decoded image bytes (patch rows) per lane and image source that map "
                           "results not consumed yet and map tasks in flight may hold, a task "
                           "weighed at its worst case until it is done (backpressure bound: "
                           "fewer and smaller tasks, never other data; a document's worst "
                           "case always fits; docs/architecture.md, Backpressure).",
                           default=512 << 20, ge=1, le=1 << 40)

    def __post_init__(self) -> None:
        # Knobs built in code skip model.load's checks; prefetch 0 would end every stream at
        # once (a knob changing the output) and task_docs 0 would never finish a block.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"knobs.{f.name} must be an integer, got {value!r}")
            model._check_bounds(value, f.metadata, f"knobs.{f.name}")

"""Knobs: settings that change speed and memory, never a byte of output (DESIGN section 1).

The world size and rank are knobs too, but they are passed to the loader directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from datalane.spec.model import doc

__all__ = ["Knobs"]


@dataclass(frozen=True)
class Knobs:
    """Performance settings of a loader or sidecar."""

    workers: int = doc("Threads running the map stages (decode, filter, tokenize), shared by "
                       "every lane in the process.", default=2, ge=1, le=256)
    prefetch: int = doc("Map tasks in flight per lane and source (backpressure bound).",
                        default=8, ge=1, le=1024)
    task_docs: int = doc("Documents per map task (one batched tokenizer call); a stream's "
                         "first tasks are smaller and double up to this.",
                         default=256, ge=1, le=65536)

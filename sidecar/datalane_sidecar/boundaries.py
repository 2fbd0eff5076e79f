"""Step boundaries a session keeps, and the checkpoint JSON built from them on demand.

A session keeps the lane states of every step boundary since the last checkpoint (up to a few
thousand): the trainer may checkpoint any of them, and a reader may attach at any of them. A
:class:`Boundary` holds only each lane's state as compact JSON (a few hundred bytes per lane,
whatever the number of source files); :class:`CheckpointText` builds the full checkpoint JSON
of a boundary - the lane states plus the recipe's fingerprint document, which lists every
source file and is serialized once per plan - only when a boundary is sent to a trainer or
saved. The text is byte for byte what ``json.dumps(loader.state_dict(), separators=(",",
":"))`` gives. Used by :mod:`datalane_sidecar.session` and :mod:`datalane_sidecar.service`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from datalane.engine.plan import Plan
from datalane.spec.state import LaneState, checkpoint_text

__all__ = ["Boundary", "CheckpointText", "lane_json"]

_COMPACT = (",", ":")


def lane_json(state: LaneState | dict[str, Any]) -> str:
    """A lane state as the compact JSON a :class:`Boundary` keeps."""
    data = state.to_json() if isinstance(state, LaneState) else state
    return json.dumps(data, separators=_COMPACT)


@dataclass(frozen=True)
class Boundary:
    """The lane states of a rank at the boundary before ``step``: ``(lane, compact JSON)``
    in lane order."""

    step: int
    lanes: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, checkpoint: dict[str, Any]) -> Boundary:
        """From a loader's ``state_dict()`` (its fingerprint document is not kept)."""
        lanes = checkpoint["lanes"]
        return cls(int(checkpoint["step"]),
                   tuple((int(k), lane_json(v)) for k, v in lanes.items()))

    def nbytes(self) -> int:
        """Bytes of the kept lane states (what a boundary costs the sidecar's memory)."""
        return sum(len(text) for _, text in self.lanes)


class CheckpointText:
    """Checkpoint JSON (``datalane.checkpoint/v1``) of the boundaries of one plan."""

    def __init__(self, plan: Plan) -> None:
        self._fingerprint = plan.fingerprint
        self._lanes_total = plan.recipe.lanes
        self._doc = json.dumps(plan.fingerprint_doc, separators=_COMPACT)  # once per plan

    def text(self, boundary: Boundary) -> str:
        return checkpoint_text(boundary.step, self._fingerprint, self._lanes_total,
                               boundary.lanes, self._doc)

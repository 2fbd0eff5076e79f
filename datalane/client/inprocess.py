"""In-process mode: the client's interface and stream with no sidecar (DESIGN section 6).

Runs the lane engine in the trainer's process; yields exactly the microbatches a sidecar
would serve, and its ``state_dict`` is interchangeable with the sidecar client's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from datalane.client.batch import Batch
from datalane.client.position import Position
from datalane.spec.errors import MismatchError
from datalane.spec.fingerprint import check_fingerprint
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import microbatches_per_step
from datalane.spec.recipe import Recipe
from datalane.spec.state import Checkpoint

__all__ = ["InProcessLoader"]


class InProcessLoader:
    """Microbatches of rank ``rank`` of ``world_size``, computed in this process."""

    def __init__(self, recipe: Recipe, rank: int, world_size: int, microbatch_size: int,
                 knobs: Knobs | None = None) -> None:
        from datalane.engine.loader import Loader

        self._loader = Loader(recipe, rank, world_size, knobs)
        self.per_step = microbatches_per_step(recipe.global_batch_size, world_size,
                                              microbatch_size)
        self.microbatch_size = microbatch_size
        self.world_size = world_size
        self.position = Position(fingerprint=self._loader.plan.fingerprint,
                                 world_size=world_size, microbatch_size=microbatch_size)
        self._iterating = False

    def __iter__(self) -> Iterator[Batch]:
        loader = self._loader
        pos = self.position
        if pos.state_json is not None:
            loader.load_state_dict(json.loads(pos.state_json))
        skip = pos.consumed
        m = self.microbatch_size
        while True:
            step = loader.next_step()
            after = json.dumps(loader.state_dict(), separators=(",", ":"))
            for i in range(self.per_step):
                if skip:
                    skip -= 1
                    continue
                sl = slice(i * m, (i + 1) * m)
                batch = Batch(step.step, i, step.input_ids[sl], step.positions[sl], step.ended,
                              step.lane_digests if i == self.per_step - 1 else {})
                pos.advance(step.step, i, self.per_step, after)
                yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.position.to_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pos = Position.from_state(state)
        plan = self._loader.plan
        if pos.state_json is not None:  # the lane states carry the fingerprint document
            ckpt = Checkpoint.from_json(json.loads(pos.state_json), "the client state")
            check_fingerprint(ckpt.fingerprint, ckpt.fingerprint_doc, plan.fingerprint,
                              plan.fingerprint_doc, "the client state")
        elif pos.fingerprint and pos.fingerprint != plan.fingerprint:
            raise MismatchError(f"the client state belongs to recipe fingerprint "
                                f"{pos.fingerprint[:16]}..., this recipe has "
                                f"{plan.fingerprint[:16]}...")
        pos.check_layout(self.world_size, self.microbatch_size)
        pos.fingerprint = plan.fingerprint
        pos.world_size, pos.microbatch_size = self.world_size, self.microbatch_size
        self.position = pos

    def close(self) -> None:
        self._loader.close()

"""In-process mode: the client's interface and stream with no sidecar (docs/client.md).

Runs the lane engine in the trainer's process; yields exactly the microbatches a sidecar
would serve (the same columns, in the engine's schema order), and its ``state_dict`` is
interchangeable with the sidecar client's. With ``stream="<name>"`` it runs an eval stream of
the recipe (:func:`datalane.spec.evals.eval_recipe`) as the sidecar client does: every
iteration is one evaluation, the stream's ``steps`` steps from step 0, and then it ends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from datalane.client import dataparallel
from datalane.client.batch import Batch
from datalane.client.position import Position
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.evals import TRAIN, check_stream, eval_recipe, eval_steps
from datalane.spec.fingerprint import check_fingerprint
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import rank_shape
from datalane.spec.recipe import Recipe
from datalane.spec.schema import SampleSchema
from datalane.spec.state import Checkpoint

if TYPE_CHECKING:
    from datalane.engine.plan import Plan

__all__ = ["InProcessLoader"]


class InProcessLoader:
    """Microbatches of data-parallel rank ``rank`` of ``world_size``, computed in this process.

    ``rank``/``world_size`` are the data-parallel ones; pass ``mesh=`` (the data-parallel
    ``DeviceMesh``) instead, or neither under torchrun (see :mod:`datalane.client.dataparallel`).
    Tensor-parallel peers each compute the same stream (use the sidecar to compute it once).
    ``stream`` names an eval stream of the recipe to read instead of the training stream.
    """

    def __init__(self, recipe: Recipe, rank: int | None = None, world_size: int | None = None,
                 microbatch_size: int = 1, knobs: Knobs | None = None, *,
                 mesh: Any = None, stream: str = TRAIN) -> None:
        from datalane.engine.loader import Loader

        dp = dataparallel.resolve(rank, world_size, mesh=mesh, readers=1, reader=0)
        self.rank, self.world_size = dp.rank, dp.world_size
        self.stream = check_stream(recipe, stream)
        self.steps = eval_steps(recipe, self.stream)  # None: endless (the training stream)
        if self.stream != TRAIN:
            recipe = eval_recipe(recipe, self.stream)
        self._loader = Loader(recipe, dp.rank, dp.world_size, knobs)
        # the same count on every rank: a rank with fewer lanes ends a step with padded ones
        self.per_step = rank_shape(recipe.lanes, recipe.global_batch_size, dp.world_size,
                                   dp.rank, microbatch_size).total
        self.microbatch_size = microbatch_size
        self.position = Position(fingerprint=self._loader.plan.fingerprint,
                                 world_size=dp.world_size, microbatch_size=microbatch_size)
        self._start = self._loader.state_dict()  # step 0, for an iterator started again
        self._generation = 0
        self._at_boundary = True  # the engine stands at the position's step boundary

    @property
    def lanes(self) -> range:
        """The lanes of this loader's data-parallel rank."""
        return self._loader.lanes

    @property
    def lanes_total(self) -> int:
        return self._loader.recipe.lanes

    @property
    def plan(self) -> Plan:
        """The recipe's plan (the engine's): its tokenizer and document kinds."""
        return self._loader.plan

    @property
    def schema(self) -> SampleSchema:
        """The recipe's sample schema (the engine's)."""
        return self._loader.schema

    def __iter__(self) -> Iterator[Batch]:
        """Microbatches from the position on; another ``iter()`` continues at the position
        (the microbatch after the last one handed out) and retires this iterator. On an eval
        stream every iterator is one evaluation: from step 0 to the stream's last step."""
        self._generation += 1
        generation = self._generation
        if self.steps is not None:
            self._rewind()
        loader = self._loader
        pos = self.position
        if not self._at_boundary and (loader.step != pos.step or pos.consumed):
            # the engine ran ahead of the position (an earlier iterator stopped inside a step)
            loader.load_state_dict(json.loads(pos.state_json) if pos.state_json is not None
                                   else self._start)
        self._at_boundary = False
        skip = pos.consumed
        m = self.microbatch_size
        schema = self.schema
        while self.steps is None or loader.step < self.steps:
            step = loader.next_step()
            after = json.dumps(loader.state_dict(), separators=(",", ":"))
            for i in range(self.per_step):
                if skip:
                    skip -= 1
                    continue
                batch = Batch(step.step, i, step.microbatch(i, m).columns, step.ended,
                              step.lane_digests if i == self.per_step - 1 else {}, schema,
                              step.step_tokens)
                pos.advance(step.step, i, self.per_step, after)
                yield batch
                if self._generation != generation:
                    raise ConfigError("this iterator of the loader was retired: another "
                                      "iterator was started and continues at the position; "
                                      "iterate one at a time")

    def restart(self) -> None:
        """Go back to step 0 of the eval stream (an open iterator is retired)."""
        if self.steps is None:
            raise ConfigError("restart() is for eval streams; the training stream resumes "
                              "with load_state_dict()")
        self._generation += 1
        self._rewind()

    def _rewind(self) -> None:
        self.position = Position(fingerprint=self._loader.plan.fingerprint,
                                 world_size=self.world_size,
                                 microbatch_size=self.microbatch_size)
        self._loader.load_state_dict(self._start)
        self._at_boundary = True

    def _train_only(self, what: str) -> None:
        if self.steps is not None:
            raise ConfigError(f"eval stream {self.stream!r} has no {what}: it is never "
                              f"checkpointed, and every evaluation starts at step 0 "
                              f"(restart() goes back there)")

    def state_dict(self) -> dict[str, Any]:
        self._train_only("state_dict()")
        return self.position.to_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._train_only("load_state_dict()")
        pos = Position.from_state(state)
        plan = self._loader.plan
        if pos.state_json is not None:  # the lane states carry the fingerprint document
            ckpt = Checkpoint.from_json(json.loads(pos.state_json), "the client state")
            check_fingerprint(ckpt.fingerprint, ckpt.fingerprint_doc, plan.fingerprint,
                              plan.fingerprint_doc, "the client state", step=ckpt.step)
        elif pos.fingerprint and pos.fingerprint != plan.fingerprint:
            raise MismatchError(f"the client state belongs to recipe fingerprint "
                                f"{pos.fingerprint[:16]}..., this recipe has "
                                f"{plan.fingerprint[:16]}...")
        pos.check_layout(self.world_size, self.microbatch_size, self.per_step)
        pos.fingerprint = plan.fingerprint
        pos.world_size, pos.microbatch_size = self.world_size, self.microbatch_size
        self.position = pos
        self._generation += 1  # an open iterator is at the old position
        self._loader.load_state_dict(json.loads(pos.state_json) if pos.state_json is not None
                                     else self._start)
        self._at_boundary = True

    def close(self) -> None:
        self._loader.close()

    def __enter__(self) -> InProcessLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The loader: the lanes of one rank, as steps and microbatches of numpy arrays.

``Loader(recipe, rank, world_size, knobs)`` owns lanes ``[floor(r*L/W), floor((r+1)*L/W))``
(docs/architecture.md, Trainers, ranks and readers; any ``1 <= W <= L``); every step its lanes'
windows, in lane order, are the rank's local batch. Cut into microbatches, a step has the same
number on every rank (:func:`datalane.spec.lanes.rank_shape`): a rank with fewer lanes ends its
step with fully padded microbatches. All lanes of the loader share one worker pool.
``state_dict()`` between steps returns a checkpoint of the rank's lanes; the union of all ranks'
checkpoints of a step restores any world size (:func:`datalane.spec.state.merge_checkpoints`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from datalane.engine.lane import LaneStream
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec import imagecolumns
from datalane.spec.codepolicy import CodePolicy
from datalane.spec.errors import MismatchError
from datalane.spec.fingerprint import check_fingerprint
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.lanes import lanes_of_rank, rank_shape
from datalane.spec.recipe import Recipe
from datalane.spec.schema import SampleSchema, TextColumns
from datalane.spec.state import Checkpoint, Counters, LaneState
from datalane.spec.targets import trained_tokens

__all__ = ["Loader", "Microbatch", "Step"]

_OPEN_THREADS = 8  # lanes opened side by side


@dataclass
class Step(TextColumns):
    """A rank's local batch of one step: its lanes' windows, in lane order."""

    step: int
    #: schema order; per-token columns (B/W, seq_len + 1); per-image columns: the images of
    #: the step's rows (datalane.spec.imagecolumns), ``image_seq`` a row of the step
    columns: dict[str, np.ndarray]
    lane_digests: dict[int, bytes]  # window digest of each lane this rank owns
    ended: bool  # every lane of this rank has run out of data (later steps are padding)
    schema: SampleSchema | None = None  # the pad values of microbatches past the real rows
    step_tokens: int = 0  # trained targets of the step (datalane.spec.targets)

    def global_hash(self) -> str:
        """The global step hash; valid only when this step holds every lane (W = 1)."""
        return global_hash(self.lane_digests[k] for k in sorted(self.lane_digests))

    def microbatch(self, index: int, size: int) -> Microbatch:
        """Sequences ``index*size .. (index+1)*size - 1`` of the step, as views: the one
        place a step is cut into microbatches (the loader, the sidecar, in-process clients).
        An index past the step's rows (a rank with fewer lanes than others) is a fully padded
        microbatch: every column its pad value."""
        start = index * size
        rows = len(self.columns["positions"])
        schema = self.schema
        if start >= rows:
            if self.schema is None:
                raise ValueError(f"microbatch {index} of {size} sequences lies past the "
                                 f"{rows} rows of step {self.step}, and the step has no "
                                 f"schema to pad with")
            seq = self.columns["positions"].shape[1]
            return Microbatch(self.step, index, self.schema.empty(size, seq), self.ended,
                              self.step_tokens)
        if start + size > rows:
            raise ValueError(f"microbatch {index} of {size} sequences straddles the end of the "
                             f"{rows} rows of step {self.step}")
        cut = slice(start, start + size)
        if schema is None or not schema.image_columns:
            columns = {k: v[cut] for k, v in self.columns.items()}
        else:  # the per-token columns' rows, then the images of those rows
            columns = {c.name: self.columns[c.name][cut] for c in schema if not c.per_image}
            columns.update(imagecolumns.select(self.columns, start, start + size))
        return Microbatch(self.step, index, columns, self.ended, self.step_tokens)


@dataclass
class Microbatch(TextColumns):
    """Consecutive sequences of a rank's local batch."""

    step: int
    index: int
    columns: dict[str, np.ndarray]  # schema order (per-image: ``image_seq`` a row of these)
    ended: bool  # the step's ``ended``: this rank's lanes have run out of data
    step_tokens: int = 0  # the step's trained targets on this rank (all its microbatches)


class Loader:
    """Steps of one rank of a ``world_size``-rank job; resumable with ``state_dict``."""

    def __init__(self, recipe: Recipe, rank: int = 0, world_size: int = 1,
                 knobs: Knobs | None = None, *, plan: Plan | None = None,
                 pool: TaskPool | None = None,
                 predicate_modules: Sequence[str] | None = None) -> None:
        """``predicate_modules``: the modules the recipe's filter predicates may come from
        (module prefixes; None: ``$DATALANE_PREDICATE_MODULES`` if set, else any module but
        Python's standard library; :mod:`datalane.spec.codepolicy`)."""
        self.recipe = recipe
        self.rank = rank
        self.world_size = world_size
        self.lanes = lanes_of_rank(recipe.lanes, world_size, rank)  # checks rank and W
        self.knobs = knobs or Knobs()
        self.plan = plan if plan is not None else Plan.build(recipe)
        self._own_pool = pool is None
        self._pool = pool or TaskPool.of(self.knobs)
        self._stages = self.plan.map_stages(CodePolicy.of(predicate_modules))
        self._streams: list[LaneStream] | None = None
        self._restore: Checkpoint | None = None
        self._step = 0
        self._layout: list[tuple[str, tuple[int, ...], np.dtype[Any]]] | None = None
        self._images = bool(self.plan.schema.image_columns)

    # -- state -------------------------------------------------------------------------------
    @property
    def schema(self) -> SampleSchema:
        """The columns of every sequence this loader produces."""
        return self.plan.schema

    @property
    def step(self) -> int:
        """The next step this loader will produce."""
        return self._step

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint of this rank's lanes at the current step boundary (JSON-serializable)."""
        if self._streams is not None:
            lanes = {s.lane: s.state() for s in self._streams}
        elif self._restore is not None:
            lanes = {k: self._restore.lanes[k] for k in self.lanes}
        else:
            n = len(self.recipe.sources)
            lanes = {k: LaneState.initial(k, n) for k in self.lanes}
        return Checkpoint(self._step, self.plan.fingerprint, self.plan.fingerprint_doc, lanes,
                          self.recipe.lanes).to_json()

    def load_state_dict(self, state: dict[str, Any] | Checkpoint, *,
                        allow_unsealed: bool = False) -> None:
        """Resume from a checkpoint holding (at least) this rank's lanes; a JSON state without
        its ``sha256`` (datalane 0.1's) only with ``allow_unsealed``."""
        ckpt = state if isinstance(state, Checkpoint) else Checkpoint.from_json(
            state, allow_unsealed=allow_unsealed)
        check_fingerprint(ckpt.fingerprint, ckpt.fingerprint_doc, self.plan.fingerprint,
                          self.plan.fingerprint_doc, "the checkpoint", step=ckpt.step)
        if ckpt.lanes_total != self.recipe.lanes:
            raise MismatchError(f"the checkpoint has {ckpt.lanes_total} lanes; the recipe has "
                                f"{self.recipe.lanes}")
        missing = [lane for lane in self.lanes if lane not in ckpt.lanes]
        if missing:
            have = ", ".join(str(k) for k in sorted(ckpt.lanes)) or "none"
            raise MismatchError(
                f"rank {self.rank} of {self.world_size} needs lanes {self.lanes.start}-"
                f"{self.lanes.stop - 1}, but the checkpoint of step {ckpt.step} holds lanes "
                f"{have} (missing {missing[:8]}); merge every rank's checkpoint of that step")
        for lane in self.lanes:
            seqs = ckpt.lanes[lane].sequences
            if seqs != ckpt.step * self.recipe.lane_batch:
                raise MismatchError(f"lane {lane} of the checkpoint is {seqs} sequences in, but "
                                    f"step {ckpt.step} is {ckpt.step * self.recipe.lane_batch}")
        self.close_streams()
        self._restore = ckpt
        self._step = ckpt.step

    # -- iteration ---------------------------------------------------------------------------
    def _open(self) -> list[LaneStream]:
        if self._streams is None:
            states = self._restore.lanes if self._restore is not None else {}

            def open_lane(lane: int) -> LaneStream:
                stream = LaneStream(self.plan, lane, self._stages, self._pool, self.knobs,
                                    states.get(lane))
                stream.prime()
                return stream

            if len(self.lanes) == 1:
                self._streams = [open_lane(self.lanes[0])]
            else:
                # Opening a lane reads (re-fetching a restored packer's carried document, then
                # the current shuffle block) before its first map task can start; the reads
                # wait on storage and decompression outside the GIL, so the lanes open side by
                # side and their first tasks start together.
                with ThreadPoolExecutor(min(len(self.lanes), _OPEN_THREADS),
                                        thread_name_prefix="datalane-open") as openers:
                    opening = [openers.submit(open_lane, lane) for lane in self.lanes]
                failed = [e for e in (f.exception() for f in opening) if e is not None]
                if failed:  # the first lane's error, and no lane left reading
                    for f in opening:
                        if f.exception() is None:
                            f.result().close()
                    raise failed[0]
                self._streams = [f.result() for f in opening]
            self._restore = None
        return self._streams

    def next_step(self) -> Step:
        streams = self._open()
        schema = self.plan.schema
        rows = self.recipe.lane_batch
        size = self.recipe.sequence_tokens
        # the lanes fill their rows of the step in place, and each window is hashed on this
        # thread as it is filled (hashlib releases the GIL: the map workers run meanwhile)
        if self._layout is None:  # the step's per-token columns: (name, shape, dtype)
            self._layout = [(c.name, c.shape(rows * len(streams), size), c.np_dtype)
                            for c in schema if not c.per_image]
        columns = {name: np.empty(shape, dtype=dtype) for name, shape, dtype in self._layout}
        windows = []
        lane_digests: dict[int, bytes] = {}
        for k, s in enumerate(streams):
            w = s.next_window({n: a[k * rows:(k + 1) * rows] for n, a in columns.items()})
            windows.append(w)
            lane_digests[w.lane] = w.digest  # lane order, as the windows came
        if self._images:  # the windows' images, rows counted from the step's first
            columns.update(imagecolumns.concat([(k * rows, w.columns)
                                                for k, w in enumerate(windows)]))
        step_tokens = 0  # the windows' trained targets, counted in the columns if need be
        for w in windows:
            if w.trained is None:
                step_tokens = trained_tokens(columns)
                break
            step_tokens += w.trained
        step = Step(
            step=self._step,
            columns=columns,
            lane_digests=lane_digests,
            ended=all(w.ended for w in windows),
            schema=schema,
            step_tokens=step_tokens,
        )
        self._step += 1
        return step

    def __iter__(self) -> Iterator[Step]:
        """Steps forever; after the data ends, steps are padding with ``ended`` set."""
        while True:
            yield self.next_step()

    def microbatches(self, size: int) -> Iterator[Microbatch]:
        """Microbatches of ``size`` sequences, step after step: the same number per step on
        every rank of the world, the rank's real ones then fully padded ones."""
        per_step = rank_shape(self.recipe.lanes, self.recipe.global_batch_size,
                              self.world_size, self.rank, size).total
        for step in self:
            for i in range(per_step):
                yield step.microbatch(i, size)

    def mixture_tokens(self) -> list[int]:
        """Tokens the mixture has taken from each source, summed over this loader's lanes
        (since the run's first step: restored with the lanes)."""
        n = len(self.recipe.sources)
        if self._streams is not None:
            states = [s.mixture.consumed for s in self._streams]
        elif self._restore is not None:
            states = [list(self._restore.lanes[k].mixture) for k in self.lanes]
        else:
            states = []
        return [sum(m[i] for m in states) for i in range(n)]

    def counters(self) -> Counters:
        total = Counters()
        for s in self._streams or []:
            total.add(s.counters)
        return total

    def close_streams(self) -> None:
        for s in self._streams or []:
            s.close()
        self._streams = None

    def close(self) -> None:
        self.close_streams()
        if self._own_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

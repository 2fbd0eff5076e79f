"""One lane: sources -> mixture -> packer -> step windows, with its resume point.

A lane's stream is a function of ``(recipe, lane)`` alone (docs/architecture.md, One lane).
Window ``s`` is the lane's sequences ``s*B/L .. (s+1)*B/L - 1``. After every source is exhausted
and the packer is flushed the lane has *ended*; its later windows are padding (ids = pad,
positions = -1), so ranks stay in lockstep until every lane has ended.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from datalane.engine.docstream import DocStream
from datalane.engine.documents.base import Doc
from datalane.engine.lanecheck import FRESH, check_lane_state
from datalane.engine.mapstage import MapStage
from datalane.engine.mixture import Mixture
from datalane.engine.packers import PACKERS, PackContext, Packer
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec import imagecolumns
from datalane.spec.errors import MismatchError
from datalane.spec.hashing import window_digest
from datalane.spec.knobs import Knobs
from datalane.spec.phases import Schedule
from datalane.spec.schema import SampleSchema, TextColumns
from datalane.spec.state import Counters, LaneState, PackerState

__all__ = ["LaneStream", "Window"]


class Window(TextColumns):
    """One lane's share of one step: its sequences' columns, in schema order (per-image
    columns: the images of its rows, ``image_seq`` counted from its first row), and what its
    documents carried beside their tokens (``placed``: ``(row, token offset in the row,
    value)`` in row and offset order; vision: each image's patches at its first placeholder)."""

    __slots__ = ("_digest", "columns", "ended", "lane", "placed", "schema", "trained")

    def __init__(self, lane: int, schema: SampleSchema, columns: dict[str, np.ndarray],
                 ended: bool, trained: int | None = None,
                 placed: list[tuple[int, int, Any]] | None = None) -> None:
        self.lane = lane
        self.schema = schema
        self.columns = columns
        self.ended = ended
        self.placed = placed if placed is not None else []
        # its trained targets (datalane.spec.targets), when the lane knows them without
        # looking at the columns (None: count them)
        self.trained = trained
        self._digest: bytes | None = None

    @property
    def digest(self) -> bytes:
        """The window digest (:func:`datalane.spec.hashing.window_digest`), computed once."""
        if self._digest is None:
            self._digest = window_digest(self.schema, self.columns)
        return self._digest


class LaneStream:
    """The ordered, stateful part of a lane; map work goes to the shared pool."""

    def __init__(self, plan: Plan, lane: int, stages: list[MapStage], pool: TaskPool,
                 knobs: Knobs, state: LaneState | None = None) -> None:
        recipe = plan.recipe
        self.plan = plan
        self.lane = lane
        schedule = Schedule.of(recipe)
        if state is not None:
            check_lane_state(plan, lane, state, schedule)
            state = _with_added_sources(state, len(recipe.sources))
        self.counters = Counters()
        if state is not None:
            self.counters.add(state.counters)
        self.streams = [
            DocStream(sp, lane, stages[sp.index], pool, knobs, recipe.shuffle.block_size,
                      recipe.bad_records, self.counters,
                      state.sources[sp.index] if state is not None else None,
                      recipe.bad_records_max_fraction)
            for sp in plan.sources
        ]
        # the weights in force are those of the last window before the state (none: step 0)
        step = max(state.sequences // recipe.lane_batch - 1, 0) if state is not None else 0
        self.mixture = Mixture(self.streams, schedule.weights(step),
                               list(state.mixture) if state is not None else None,
                               schedule=schedule, step=step,
                               base=state.mixture_base if state is not None else None,
                               ran_out=self._ran_out)
        self._phases = not schedule.constant
        ctx = PackContext(self.mixture.next_doc, self._fetch, recipe.sequence_tokens,
                          plan.schema, self.counters, recipe.packing, f"lane {lane} state",
                          self.mixture.next_run)
        self._ctx = ctx
        self.packer: Packer = PACKERS[recipe.packing.algorithm](
            ctx, state.packer if state is not None else None)
        # a packer that can fill a whole window at once does (every column per token)
        bulk = self.packer.fills_windows and all(c.per_token for c in plan.schema)
        self._fill = self.packer.fill_window if bulk else None
        # without a loss mask, a window's trained targets are its tokens less one per row
        # that holds any (a row is its pieces then padding; its first token is no target)
        self._unmasked = "loss_mask" not in plan.schema.names
        # a recipe with images: the width of their patch rows (the window's per-image columns
        # are built from the images its packer placed)
        self._image_width = (plan.schema.column(imagecolumns.PATCHES).width
                             if plan.schema.image_columns else None)
        self.sequences = state.sequences if state is not None else 0
        self.ended = state.ended if state is not None else False

    def _ran_out(self, source: int) -> bool:
        """Whether the source's resume point is past its last epoch (the same in a run and in
        its restore, unlike the mixture's discovery that a stream has ended)."""
        epochs = self.plan.sources[source].source.epochs
        return epochs is not None and self.streams[source].cursor.epoch >= epochs

    def _fetch(self, source: int, ref: tuple[int, ...]) -> Doc:
        """A carried document, by reference; MismatchError for one the recipe cannot hold."""
        ok = 0 <= source < len(self.plan.sources) and \
            self.streams[source].position(ref) is not None
        if not ok:
            raise MismatchError(f"lane {self.lane} state: carried piece of source {source}, "
                                f"document {list(ref)}, is not a document of the recipe")
        return self.streams[source].fetch(ref)

    def prime(self) -> None:
        """Start reading and tokenizing every source before the first window is asked for."""
        for stream in self.streams:
            stream.prime()

    @property
    def step(self) -> int:
        return self.sequences // self.plan.recipe.lane_batch

    def next_window(self, out: dict[str, np.ndarray] | None = None) -> Window:
        """The lane's next window; ``out`` (arrays of ``lane_batch`` rows per column, for
        example the lane's rows of the step) receives it in place."""
        self.mixture.at_step(self.step)
        recipe = self.plan.recipe
        rows = recipe.lane_batch
        size = recipe.sequence_tokens
        schema = self.plan.schema
        columns = out if out is not None else {
            c.name: np.empty(c.shape(rows, size), dtype=c.np_dtype) for c in schema
            if not c.per_image}
        if self._fill is not None and not self.ended:  # the packer fills the window in bulk
            before = self.counters.tokens
            filled = self._fill(columns, rows)
            if filled < rows:
                self.ended = True
            self.sequences += rows
            trained = self.counters.tokens - before - filled if self._unmasked else None
            return Window(self.lane, schema, columns, self.ended, trained)
        trained = 0 if self.ended else None  # (a window of padding trains nothing)
        placed: list[tuple[int, int, Any]] = []
        for r in range(rows):
            seq = None if self.ended else self.packer.next_sequence()
            if seq is None:
                self.ended = True
                for c in schema:
                    if not c.per_image:
                        columns[c.name][r] = c.pad
                self.counters.padding += size
            else:
                for name, a in columns.items():
                    a[r] = seq[name]
                placed.extend((r, offset, value) for offset, value in self._ctx.placed)
                self._ctx.placed = []  # the window holds them now, the lane no longer
        self.sequences += rows
        if self._image_width is not None:
            columns.update(imagecolumns.build(placed, self._image_width))
        return Window(self.lane, schema, columns, self.ended, trained, placed)

    def state(self) -> LaneState:
        """The resume point between two steps (call it only after a whole window)."""
        counters = Counters()
        counters.add(self.counters)
        return LaneState(
            lane=self.lane,
            sequences=self.sequences,
            sources=tuple(s.cursor for s in self.streams),
            mixture=tuple(self.mixture.consumed),
            packer=PackerState(self.packer.name, self.packer.state()),
            ended=self.ended,
            counters=counters,
            mixture_base=self.mixture.base() if self._phases else None,
        )

    def close(self) -> None:
        for s in self.streams:
            s.close()


def _with_added_sources(state: LaneState, sources: int) -> LaneState:
    """``state`` with fresh cursors (0 consumed) for the sources the recipe added after the
    others (:func:`check_lane_state` made sure they are unused so far)."""
    more = sources - len(state.sources)
    if not more:
        return state
    base = state.mixture_base.extended(sources) if state.mixture_base is not None else None
    return dataclasses.replace(state, sources=(*state.sources, *(FRESH,) * more),
                               mixture=(*state.mixture, *(0,) * more), mixture_base=base)

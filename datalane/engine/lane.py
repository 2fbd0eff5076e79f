"""One lane: sources -> mixture -> packer -> step windows, with its resume point.

A lane's stream is a function of ``(recipe, lane)`` alone (DESIGN section 3). Window ``s`` is
the lane's sequences ``s*B/L .. (s+1)*B/L - 1``. After every source is exhausted and the packer
is flushed the lane has *ended*; its later windows are padding (ids = pad, positions = -1), so
ranks stay in lockstep until every lane has ended.
"""

from __future__ import annotations

import numpy as np

from datalane.engine.docstream import DocStream
from datalane.engine.mapstage import MapStage
from datalane.engine.mixture import Mixture
from datalane.engine.packing import BestFitPacker, Packer, WrapPacker
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.errors import MismatchError
from datalane.spec.hashing import window_digest
from datalane.spec.knobs import Knobs
from datalane.spec.state import Counters, LaneState, Piece, check_carry

__all__ = ["LaneStream", "Window"]


class Window:
    """One lane's share of one step."""

    __slots__ = ("digest", "ended", "input_ids", "lane", "positions")

    def __init__(self, lane: int, input_ids: np.ndarray, positions: np.ndarray,
                 ended: bool) -> None:
        self.lane = lane
        self.input_ids = input_ids
        self.positions = positions
        self.ended = ended
        self.digest = window_digest(input_ids, positions)


class LaneStream:
    """The ordered, stateful part of a lane; map work goes to the shared pool."""

    def __init__(self, plan: Plan, lane: int, stages: list[MapStage], pool: TaskPool,
                 knobs: Knobs, state: LaneState | None = None) -> None:
        recipe = plan.recipe
        self.plan = plan
        self.lane = lane
        if state is not None:
            self._check(state)
        self.counters = Counters()
        if state is not None:
            self.counters.add(state.counters)
        self.streams = [
            DocStream(sp, lane, stages[sp.index], pool, knobs, recipe.shuffle.block_size,
                      recipe.bad_records, self.counters,
                      state.sources[sp.index] if state is not None else None)
            for sp in plan.sources
        ]
        self.mixture = Mixture(self.streams, [s.weight for s in recipe.sources],
                               list(state.mixture) if state is not None else None)
        size = recipe.sequence_tokens
        pad = plan.tokenizer.pad_id
        carry = state.carry if state is not None else ()
        self.packer: Packer
        if recipe.packing.algorithm == "wrap":
            self.packer = WrapPacker(self.mixture, size, pad, self.counters, carry, self._fetch)
        else:
            self.packer = BestFitPacker(self.mixture, size, pad, self.counters,
                                        recipe.packing.bestfit_bins, carry,
                                        state.pending if state is not None else None,
                                        self._fetch)
        self.sequences = state.sequences if state is not None else 0
        self.ended = state.ended if state is not None else False

    def _check(self, state: LaneState) -> None:
        recipe = self.plan.recipe
        if state.lane != self.lane:
            raise MismatchError(f"the state of lane {state.lane} cannot restore lane {self.lane}")
        for what, n in (("source cursors", len(state.sources)),
                        ("mixture counters", len(state.mixture))):
            if n != len(recipe.sources):
                raise MismatchError(f"lane {self.lane} state has {n} {what}; the recipe has "
                                    f"{len(recipe.sources)} sources")
        for i, c in enumerate(state.sources):
            chunks = self.plan.sources[i].lane_chunks(self.lane, c.epoch) if c.epoch >= 0 else []
            if min(c.epoch, c.block, c.chunk, c.offset, c.pos + 1) < 0 or (
                    c.chunk and c.chunk >= len(chunks)) or c.offset >= recipe.shuffle.block_size:
                raise MismatchError(f"lane {self.lane} state: cursor {c.encode()} of source "
                                    f"{i} points outside the source")
        bins = recipe.packing.bestfit_bins if recipe.packing.algorithm == "bestfit" else None
        check_carry(state, recipe.sequence_tokens, bins, f"lane {self.lane} state")
        pieces = [p for group in state.carry for p in group]
        if state.pending is not None:
            if recipe.packing.algorithm == "wrap":
                raise MismatchError(f"lane {self.lane} state has a pending piece, which only "
                                    f"'bestfit' packing keeps; the recipe packs with 'wrap'")
            pieces.append(state.pending)
        for p in pieces:
            if not (0 <= p.source < len(recipe.sources)
                    and 0 <= p.file < len(self.plan.sources[p.source].files)
                    and p.pos >= 0 and 0 <= p.start < p.stop):
                raise MismatchError(f"lane {self.lane} state: carried piece {p.encode()} "
                                    f"is not a token range of a document of the recipe")
        if state.sequences % recipe.lane_batch:
            raise MismatchError(f"lane {self.lane} state is {state.sequences} sequences in, not "
                                f"on a step boundary of {recipe.lane_batch} sequences")

    def _fetch(self, piece: Piece) -> np.ndarray:
        tokens = self.streams[piece.source].fetch(piece.file, piece.pos)
        if piece.stop > len(tokens):
            raise MismatchError(f"lane {self.lane} state: carried piece {piece.encode()} ends "
                                f"after its document's {len(tokens)} tokens")
        return tokens

    def prime(self) -> None:
        """Start reading and tokenizing every source before the first window is asked for."""
        for stream in self.streams:
            stream.prime()

    @property
    def step(self) -> int:
        return self.sequences // self.plan.recipe.lane_batch

    def next_window(self) -> Window:
        recipe = self.plan.recipe
        rows = recipe.lane_batch
        size = recipe.sequence_tokens
        ids = np.empty((rows, size), dtype=np.int32)
        positions = np.empty((rows, size), dtype=np.int32)
        for r in range(rows):
            seq = None if self.ended else self.packer.next_sequence()
            if seq is None:
                self.ended = True
                ids[r] = self.plan.tokenizer.pad_id
                positions[r] = -1
                self.counters.padding += size
            else:
                ids[r], positions[r] = seq
        self.sequences += rows
        return Window(self.lane, ids, positions, self.ended)

    def state(self) -> LaneState:
        """The resume point between two steps (call it only after a whole window)."""
        carry, pending = self.packer.carry()
        counters = Counters()
        counters.add(self.counters)
        return LaneState(
            lane=self.lane,
            sequences=self.sequences,
            sources=tuple(s.cursor for s in self.streams),
            mixture=tuple(self.mixture.consumed),
            carry=carry,
            pending=pending,
            ended=self.ended,
            counters=counters,
        )

    def close(self) -> None:
        for s in self.streams:
            s.close()

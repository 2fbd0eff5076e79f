"""``SidecarLoader.per_step`` before the first microbatch.

It was 0 until the first batch arrived, so ``zip(range(steps * loader.per_step), loader)``
trained on nothing with no error. Real sidecar processes on real Unix sockets.
"""

from __future__ import annotations

from typing import Any

import pytest

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader

pytestmark = pytest.mark.slow  # real sidecar processes


def _key(b: Any) -> tuple[int, int, bytes]:
    return b.step, b.index, b.input_ids.tobytes()


def test_per_step_is_known_before_the_first_microbatch(sidecar, repeat_recipe) -> None:
    """8 lanes, B=16 (2 sequences a lane) over 3 ranks own 3, 3 and 2 lanes; every rank
    yields ceil(8/3) x 2 / 2 = 3 microbatches of 2 sequences a step (rank 2's last one is
    padding). A loop sized by per_step before iterating reads exactly 2 steps, which are the
    in-process loader's."""
    sc = sidecar(repeat_recipe)
    recipe = load_recipe(repeat_recipe)
    for rank in (0, 2):
        with SidecarLoader(sc.socket, rank=rank, world_size=3, microbatch_size=2) as loader:
            assert loader.per_step == 3
            got = [b for _, b in zip(range(2 * loader.per_step), loader, strict=False)]
        ref = InProcessLoader(recipe, rank, 3, 2)
        try:
            want = [b for _, b in zip(range(6), ref, strict=False)]
        finally:
            ref.close()
        assert [(b.step, b.index) for b in got] == [(0, 0), (0, 1), (0, 2),
                                                    (1, 0), (1, 1), (1, 2)]
        assert [_key(b) for b in got] == [_key(b) for b in want]


def test_per_step_then_a_resume_reads_from_the_resumed_position(sidecar,
                                                                 repeat_recipe) -> None:
    """per_step opens a session at the start; a state loaded afterwards moves the position,
    and the iteration then reads from there (not from the early session's step 0)."""
    sc = sidecar(repeat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=4) as first:
        taken = [b for _, b in zip(range(6), first, strict=False)]  # 3 steps of 2
        state = first.state_dict()
        after = [_key(b) for _, b in zip(range(2), first, strict=False)]
    assert [(b.step, b.index) for b in taken][-1] == (2, 1)
    with SidecarLoader(sc.socket, rank=0, world_size=2, microbatch_size=4) as loader:
        assert loader.per_step == 2
        loader.load_state_dict(state)
        got = [_key(b) for _, b in zip(range(2), loader, strict=False)]
    assert [(s, i) for s, i, _ in got] == [(3, 0), (3, 1)]
    assert got == after

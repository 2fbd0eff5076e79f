"""A world size that does not divide the lanes, through a real sidecar.

The chat recipe's 4 lanes (B=8: 2 sequences a lane) over 3 ranks: ranks 0 and 1 own one lane,
rank 2 two. With microbatches of 1 sequence every rank yields 4 per step; ranks 0 and 1 end
each step with 2 fully padded ones, which the sidecar produces and sends like the real ones
(the client derives nothing). The stream equals the in-process one, and every microbatch
carries its step's count of trained targets (``step_tokens``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.spec.targets import trained_tokens
from tests.sidecar.test_columns import (
    _take,
    chat_recipe,  # noqa: F401  (the fixture)
)

pytestmark = pytest.mark.slow  # real sidecar processes


@pytest.mark.parametrize("transport", ["inline", "shm"])
def test_padded_microbatches_over_the_sidecar_are_the_in_process_ones(
        sidecar: Any, chat_recipe: str, transport: str) -> None:  # noqa: F811
    sc = sidecar(chat_recipe)
    recipe = load_recipe(chat_recipe)
    got: dict[int, list[Any]] = {}
    for rank in range(3):
        with SidecarLoader(sc.socket, rank=rank, world_size=3, microbatch_size=1,
                           transport=transport) as loader:
            got[rank] = _take(loader, 12)  # 3 steps of 4 microbatches
            assert loader.per_step == 4
            assert list(loader.lanes) == [[0], [1], [2, 3]][rank]
        ref = InProcessLoader(recipe, rank, 3, 1)
        try:
            want = _take(ref, 12)
        finally:
            ref.close()
        for a, b in zip(got[rank], want, strict=True):
            assert (a.step, a.index, a.lane_digests, a.step_tokens) == (
                b.step, b.index, b.lane_digests, b.step_tokens)
            for name in b.columns:
                assert a.columns[name].dtype == b.columns[name].dtype
                assert np.array_equal(a.columns[name], b.columns[name]), name
    for rank in (0, 1):  # one lane: microbatches 2 and 3 of every step are padding
        for b in got[rank]:
            if b.index >= 2:
                assert (b.positions == -1).all()
                assert (b.columns["loss_mask"] == 0).all()
                assert b.columns["input_ids"].shape == (1, 65)
            else:
                assert (b.positions >= 0).any()
    assert all((b.positions >= 0).any() for b in got[2])
    for step in range(3):
        per_rank = []
        for rank in range(3):
            mbs = [b for b in got[rank] if b.step == step]
            assert len({b.step_tokens for b in mbs}) == 1  # every microbatch carries it
            assert mbs[0].step_tokens == sum(trained_tokens(b.columns) for b in mbs)
            per_rank.append(mbs[0].step_tokens)
        assert all(n > 0 for n in per_rank)

"""World sizes that do not divide the lane count, end to end in-process.

8 lanes over 3, 5 or 7 ranks: each rank owns a contiguous range of floor or ceil of L/W lanes,
the global batch (every rank's rows in rank order) is the 1-rank one byte for byte, every rank
yields the same number of microbatches per step (the ranks with fewer lanes end their steps
with fully padded ones), and the ranks' trained-target counts add up to the global count.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

import numpy as np
import pytest

from datalane.client import InProcessLoader
from datalane.client.torch import DataLaneDataset, to_tensors
from datalane.engine.loader import Loader
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe
from datalane.verify import verify


def test_verify_agrees_across_uneven_worlds_and_resumes(write_recipe: Callable[..., str],
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert verify(write_recipe(), steps=6, worlds=[1, 3, 5, 7], workers=[2], resume_at=[3])
    out = capsys.readouterr().out
    assert "OK: 8 runs" in out
    assert "resume@3 on world=5 workers=2" in out  # a 3-rank checkpoint resumed on 5 ranks
    assert "DIFFERS" not in out


@pytest.mark.parametrize("world", [3, 5, 7])
def test_the_ranks_rows_in_rank_order_are_the_one_rank_batch(make_recipe: Callable[..., Recipe],
                                                             world: int) -> None:
    recipe = make_recipe()
    with Loader(recipe, 0, 1, Knobs(workers=2)) as whole:
        want = [whole.next_step() for _ in range(3)]
    ranks = [Loader(recipe, r, world, Knobs(workers=2)) for r in range(world)]
    try:
        assert [len(ld.lanes) for ld in ranks] == [
            (r + 1) * 8 // world - r * 8 // world for r in range(world)]
        for w in want:
            parts = [ld.next_step() for ld in ranks]
            for name in w.columns:
                assert np.array_equal(np.concatenate([p.columns[name] for p in parts]),
                                      w.columns[name]), name
            # the ranks' trained targets add up to the global count, which for a text
            # recipe is every non-padding target (positions 1..seq_len that are >= 0)
            assert sum(p.step_tokens for p in parts) == w.step_tokens
            assert w.step_tokens == int((w.positions[:, 1:] >= 0).sum()) > 0
    finally:
        for ld in ranks:
            ld.close()


def test_a_rank_with_fewer_lanes_ends_each_step_with_padded_microbatches(
        make_recipe: Callable[..., Recipe]) -> None:
    recipe = make_recipe()  # 8 lanes, B=16: 2 sequences a lane
    # W=3: ranks own 2, 3, 3 lanes (4, 6, 6 sequences); m=2 -> 3 microbatches per step each
    with Loader(recipe, 0, 3, Knobs(workers=2)) as ld:
        got = list(islice(ld.microbatches(2), 6))
    assert [(mb.step, mb.index) for mb in got] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                   (1, 2)]
    pad = ld.plan.schema.column("input_ids").pad
    for mb in (got[2], got[5]):
        assert mb.input_ids.shape == (2, recipe.sequence_tokens)
        assert (mb.input_ids == pad).all()
        assert (mb.positions == -1).all()
    assert (got[0].positions >= 0).any()
    for a, b, c in (got[:3], got[3:]):
        assert a.step_tokens == b.step_tokens == c.step_tokens > 0
    counts = []
    for r in range(3):
        loader = InProcessLoader(recipe, r, 3, 2, Knobs(workers=2))
        try:
            counts.append(loader.per_step)
        finally:
            loader.close()
    assert counts == [3, 3, 3]


def test_the_torch_adapter_counts_trained_labels_per_step(
        make_recipe: Callable[..., Recipe]) -> None:
    loader = InProcessLoader(make_recipe(), 0, 3, 2, Knobs(workers=2))
    try:
        items = list(islice(iter(DataLaneDataset(loader, global_tokens=True)), 6))
    finally:
        loader.close()
    for step in (items[:3], items[3:]):
        trained = sum(int((it["labels"] != -100).sum()) for it in step)
        assert trained > 0
        for it in step:
            # no process group: the global count is the local one
            assert int(it["step_tokens"]) == int(it["global_tokens"]) == trained
        assert (step[2]["labels"] == -100).all()  # the padded microbatch trains on nothing


def test_to_tensors_labels_and_step_tokens_share_one_definition() -> None:
    from datalane.client.batch import Batch

    positions = np.array([[0, 1, 2, -1], [0, 1, 0, 1]], dtype=np.int32)
    mask = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], dtype=np.uint8)
    ids = np.arange(8, dtype=np.int32).reshape(2, 4)
    t = to_tensors(Batch(0, 0, {"input_ids": ids, "positions": positions, "loss_mask": mask},
                         step_tokens=9))
    # targets 1..3: row 0 -> (pos 1 mask 1), (pos 2 mask 0), (pos -1): only the first trains
    # row 1 -> (pos 1 mask 0), (pos 0 mask 1), (pos 1 mask 1): the last two
    assert t["labels"].tolist() == [[1, -100, -100], [-100, 6, 7]]
    assert int(t["step_tokens"]) == 9

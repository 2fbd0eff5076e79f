"""A vision document's image travels with it to the packer, which places it in a sequence
(datalane/engine/documents/base.py ``Attached``, datalane/engine/packers/base.py ``assemble``).

The hand-worked shard (conftest.py): A = START, 70 placeholders, END, 8 caption tokens, EOS
(81 tokens); B = START, 128 placeholders, END, 11 caption tokens, EOS (142 tokens); a broken
image set aside. The tokenizer adds no BOS, so each image's first placeholder is token 1 of its
document.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from datalane.engine.images import ImageRule, process
from datalane.engine.lane import LaneStream, Window
from datalane.engine.plan import Plan
from datalane.engine.pool import TaskPool
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe
from datalane.spec.state import LaneState
from tests.support.vision import PAD, START, vision_recipe


@contextmanager
def _lane(recipe: Recipe, state: LaneState | None = None) -> Iterator[LaneStream]:
    plan = Plan.build(recipe)
    pool = TaskPool(2)
    lane = LaneStream(plan, 0, plan.map_stages(), pool, Knobs(workers=2), state)
    try:
        yield lane
    finally:
        lane.close()
        pool.shutdown(wait=False)


def _where(window: Window) -> list[tuple[int, int, tuple[int, int, int]]]:
    return [(row, offset, value.grid_thw) for row, offset, value in window.placed]


def _patches(image: bytes) -> np.ndarray:
    return process(image, ImageRule(), repeat_frames=False).values


def test_bestfit_places_each_image_at_its_row_and_first_placeholder(shard: Any) -> None:
    path, images = shard
    # 151 tokens a sequence, 2 a window: A opens row 0 (81 tokens), B (142) does not fit the 70
    # left and opens row 1; the data ends and both rows come out in order
    with _lane(vision_recipe([str(path)], 150, global_batch_size=2)) as lane:
        window = lane.next_window()
    assert _where(window) == [(0, 1, (1, 14, 20)), (1, 1, (1, 16, 32))]
    for (row, offset, value), image in zip(window.placed, images, strict=False):
        ids = window.columns["input_ids"][row]
        assert ids[offset - 1] == START and ids[offset] == PAD
        np.testing.assert_array_equal(value.values, _patches(image))
    # 256 tokens a sequence: B fits beside A (175 left) and starts at token 81 of row 0; its
    # first placeholder is token 82
    with _lane(vision_recipe([str(path)], 255, global_batch_size=2)) as lane:
        window = lane.next_window()
    assert _where(window) == [(0, 1, (1, 14, 20)), (0, 82, (1, 16, 32))]
    assert window.columns["input_ids"][0, 81:83].tolist() == [START, PAD]
    np.testing.assert_array_equal(window.placed[1][2].values, _patches(images[1]))


def test_a_carried_document_brings_its_image_again_on_restore(shard: Any) -> None:
    """After window 0 (A) bestfit holds B in an open sequence: its state names B by reference
    only, and the restored lane re-reads and re-processes B's image to the same patches."""
    path, images = shard
    recipe = vision_recipe([str(path)], 150)
    with _lane(recipe) as lane:
        first = lane.next_window()
        state = lane.state()
        second = lane.next_window()
    assert _where(first) == [(0, 1, (1, 14, 20))]
    # B (the sample whose header is at byte 3072 of the tar), tokens 0..141
    assert state.packer.data["bins"] == [[[0, [0, 3072], 0, 142]]]
    with _lane(recipe, state) as again:
        restored = again.next_window()
    assert _where(restored) == _where(second) == [(0, 1, (1, 16, 32))]
    np.testing.assert_array_equal(restored.placed[0][2].values, second.placed[0][2].values)
    np.testing.assert_array_equal(restored.placed[0][2].values, _patches(images[1]))

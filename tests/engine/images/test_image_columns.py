"""The per-image columns of a vision recipe's steps and microbatches, hand-worked
(datalane/spec/imagecolumns.py, docs/vlm.md Per-image columns).

The shard: A = a 96 x 64 JPEG "a red square" (grid (1, 14, 20): 280 patch rows, 70
placeholders; 1 + 70 + 1 + 8 + EOS = 81 tokens), B = a 512 x 256 PNG "two blue discs" (grid
(1, 16, 32): 512 rows, 128 placeholders; 142 tokens), C = a 64 x 64 PNG "a dark sky" grown to
256 x 256 (grid (1, 16, 16): 256 rows, 64 placeholders; 1 + 64 + 1 + 7 + 1 = 74 tokens). In
sequences of 256 tokens bestfit puts A at token 0 of row 0 and B beside it at token 81 (175
left), and C (74 tokens) does not fit the 33 left: it opens row 1 whole. Each first
placeholder follows vision_start (the tokenizer adds no BOS): offsets 1, 82 and 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from datalane.client import InProcessLoader
from datalane.client.batch import Batch
from datalane.spec.knobs import Knobs
from tests.support.vision import END, EOS, PAD, START, caption, vision_recipe, write_three

IMAGE_COLUMNS = ["image_patches", "image_grid_thw", "image_seq", "image_offset",
                 "image_patch_start"]


@pytest.fixture
def three(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    """The shard of A, B and C, and each image's patch rows (one frame, 768 bytes a row)."""
    return write_three(tmp_path / "abc.tar")


def _batches(path: Path, microbatch: int, count: int) -> list[Batch]:
    recipe = vision_recipe([str(path)], 255, global_batch_size=2)
    with InProcessLoader(recipe, 0, 1, microbatch, Knobs(workers=2)) as loader:
        it = iter(loader)
        return [next(it) for _ in range(count)]


def _doc(text: str, pads: int) -> list[int]:
    return [START, *[PAD] * pads, END, *caption(text), EOS]


def test_two_images_in_one_row_and_one_in_another(three) -> None:
    path, rows = three
    (batch,) = _batches(path, 2, 1)
    assert list(batch.columns) == ["input_ids", "positions", "loss_mask", *IMAGE_COLUMNS]
    a, b, c = _doc("a red square", 70), _doc("two blue discs", 128), _doc("a dark sky", 64)
    assert (len(a), len(b), len(c)) == (81, 142, 74)
    ids = batch.columns["input_ids"]
    assert ids[0].tolist() == [*a, *b, *[EOS] * 33]
    assert ids[1].tolist() == [*c, *[EOS] * 182]
    cols = {n: batch.columns[n] for n in IMAGE_COLUMNS}
    assert cols["image_seq"].dtype == np.int32 and cols["image_seq"].tolist() == [0, 0, 1]
    assert cols["image_offset"].dtype == np.int32 and cols["image_offset"].tolist() == [1, 82, 1]
    assert cols["image_grid_thw"].dtype == np.int32
    assert cols["image_grid_thw"].tolist() == [[1, 14, 20], [1, 16, 32], [1, 16, 16]]
    # 280 + 512 + 256 patch rows
    assert cols["image_patch_start"].dtype == np.int64
    assert cols["image_patch_start"].tolist() == [0, 280, 792, 1048]
    assert cols["image_patches"].dtype == np.uint8
    np.testing.assert_array_equal(cols["image_patches"], np.concatenate(rows))
    # each offset is the first of its image's run of grid_t * grid_h * grid_w / 4 placeholders
    for seq, off, (t, h, w) in zip(cols["image_seq"], cols["image_offset"],
                                   cols["image_grid_thw"], strict=True):
        run = ids[seq, off - 1:off + t * h * w // 4 + 1]
        assert run[0] == START and (run[1:-1] == PAD).all() and run[-1] == END


def test_an_image_that_does_not_fit_moves_whole_to_the_next_row_with_its_columns(
        three) -> None:
    """Microbatches of one sequence: C, which did not fit the 33 tokens left in row 0, is the
    first image of the next microbatch, its rows counted from that microbatch's start."""
    path, rows = three
    first, second, after = _batches(path, 1, 3)
    assert first.columns["image_seq"].tolist() == [0, 0]
    assert first.columns["image_offset"].tolist() == [1, 82]
    assert first.columns["image_patch_start"].tolist() == [0, 280, 792]
    np.testing.assert_array_equal(first.columns["image_patches"], np.concatenate(rows[:2]))
    # row 0 ends in 33 tokens of padding: no piece of C's run is in it
    assert first.columns["positions"][0, 223:].tolist() == [-1] * 33
    assert second.columns["input_ids"][0, :2].tolist() == [START, PAD]
    assert second.columns["image_seq"].tolist() == [0]
    assert second.columns["image_offset"].tolist() == [1]
    assert second.columns["image_grid_thw"].tolist() == [[1, 16, 16]]
    assert second.columns["image_patch_start"].tolist() == [0, 256]
    np.testing.assert_array_equal(second.columns["image_patches"], rows[2])
    # the data has ended: a step of padding holds no image
    assert after.step == 1 and after.ended
    assert after.columns["image_patches"].shape == (0, 768)
    assert after.columns["image_seq"].shape == (0,)
    assert after.columns["image_grid_thw"].shape == (0, 3)
    assert after.columns["image_patch_start"].tolist() == [0]


def test_a_text_recipe_batch_has_no_image_column(tmp_path: Path) -> None:
    from datalane.corpus import make_corpus
    from datalane.spec.recipe import load_recipe
    from tests.conftest import base_recipe_dict

    corpus = make_corpus(str(tmp_path), web_docs=600)
    with InProcessLoader(load_recipe(base_recipe_dict(corpus)), 0, 1, 2) as loader:
        batch = next(iter(loader))
        pad = loader.schema.column("input_ids").pad
        # the schema as a sidecar announces it: what it always was
        assert loader.schema.dumps() == (
            '[{"default":0,"dtype":"int32","fill":"document","name":"input_ids","pad":'
            f'{pad},"per_token":true}},'
            '{"default":0,"dtype":"int32","fill":"position","name":"positions","pad":-1,'
            '"per_token":true}]')
    assert list(batch.columns) == ["input_ids", "positions"]
    assert batch.columns["input_ids"].shape == (2, 129)


def test_two_vision_sources_cutting_other_patch_sizes_are_refused(three) -> None:
    from datalane.engine.plan import Plan
    from datalane.spec.errors import ConfigError

    path, _ = three
    source = {"name": "a", "uris": [str(path)], "vision": {}}
    recipe = vision_recipe([str(path)], 255, sources=[
        source, {**source, "name": "b", "vision": {"patch_size": 14}}])
    with pytest.raises(ConfigError, match=r"sources\[1\] gives the sample column "
                                          r"'image_patches' as .*'width': 588.*an earlier "
                                          r"source gives it as .*'width': 768"):
        Plan.build(recipe)


def test_a_client_restored_mid_step_gets_the_same_image_rows(three) -> None:
    """The client's state after the first microbatch (A and B) restores to C's microbatch:
    the restored loader reads the step again from its start, re-processes the images and
    hands out C's rows, byte for byte those of the unbroken run."""
    path, rows = three
    recipe = vision_recipe([str(path)], 255, global_batch_size=2)
    with InProcessLoader(recipe, 0, 1, 1, Knobs(workers=2)) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        want = next(it)
    with InProcessLoader(recipe, 0, 1, 1, Knobs(workers=1)) as again:
        again.load_state_dict(state)
        got = next(iter(again))
    assert (got.step, got.index) == (0, 1)
    assert list(got.columns) == list(want.columns)
    for name, a in want.columns.items():
        assert got.columns[name].tobytes() == a.tobytes(), name
    assert got.columns["image_patch_start"].tolist() == [0, 256]
    np.testing.assert_array_equal(got.columns["image_patches"], rows[2])
    assert got.lane_digests == want.lane_digests and len(got.lane_digests) == 1

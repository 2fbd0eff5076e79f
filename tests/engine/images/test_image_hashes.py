"""The step hash of a vision recipe covers its per-image columns (the used rows, after the
per-token columns in schema order) and, like any recipe's, does not depend on the world, the
workers or where the run was resumed (datalane/spec/hashing.py, docs/vlm.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.engine.images import ImageRule, process
from datalane.engine.loader import Loader, Step
from datalane.spec.hashing import global_hash
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import Recipe, load_recipe
from datalane.testing.images import ImageCorpus
from tests.support.vision import encoded, vision_recipe, write_shard

_IMAGE_COLUMNS = ("image_patches", "image_grid_thw", "image_seq", "image_offset",
                  "image_patch_start")


def _pair_shard(path: Path, first: bytes) -> Path:
    write_shard(path, [[("jpg", first), ("txt", b"a red square")],
                       [("png", encoded(512, 256, "PNG", 2)), ("txt", b"two blue discs")]])
    return path


def _step0(path: Path) -> Step:
    with Loader(vision_recipe([str(path)], 255), 0, 1, Knobs(workers=1)) as loader:
        return loader.next_step()


def test_the_lane_digest_is_the_token_columns_then_the_used_image_rows(tmp_path: Path) -> None:
    a = encoded(96, 64, "JPEG", 1)
    step = _step0(_pair_shard(tmp_path / "ab.tar", a))  # A at token 0, B at 81 of row 0
    rows = [process(a, ImageRule(), repeat_frames=False).values,
            process(encoded(512, 256, "PNG", 2), ImageRule(), repeat_frames=False).values]
    h = hashlib.sha256()
    for name in ("input_ids", "positions", "loss_mask"):
        h.update(step.columns[name].tobytes())
    h.update(np.concatenate(rows).tobytes())  # 280 + 512 rows of 768 bytes
    h.update(np.array([[1, 14, 20], [1, 16, 32]], dtype="<i4").tobytes())
    h.update(np.array([0, 0], dtype="<i4").tobytes())  # image_seq
    h.update(np.array([1, 82], dtype="<i4").tobytes())  # image_offset
    h.update(np.array([0, 280, 792], dtype="<i8").tobytes())  # image_patch_start
    assert step.lane_digests[0] == h.digest()


def test_the_hash_sees_the_pixels(tmp_path: Path) -> None:
    """Two shards whose images differ only in their pixels (same sizes, same captions) give
    the same tokens and different step hashes."""
    one = _step0(_pair_shard(tmp_path / "one.tar", encoded(96, 64, "JPEG", 1)))
    other = _step0(_pair_shard(tmp_path / "other.tar", encoded(96, 64, "JPEG", 9)))
    for name in ("input_ids", "positions", "loss_mask", "image_grid_thw", "image_seq",
                 "image_offset", "image_patch_start"):
        np.testing.assert_array_equal(one.columns[name], other.columns[name])
    assert one.global_hash() != other.global_hash()


def _corpus_recipe(corpus: ImageCorpus) -> Recipe:
    """4 lanes of one 1,280-token sequence a step (the largest image: 1,152 placeholders)."""
    return load_recipe({
        "lanes": 4, "global_batch_size": 4, "seq_len": 1279,
        "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
        "shuffle": {"block_size": 4},
        "sources": [{"name": "pairs", "uris": [f"{corpus.root}/*.tar"], "vision": {},
                     "chunk_rows": 5}]})


def _run(recipe: Recipe, world: int, workers: int, state: Any = None,
         steps: int | None = None) -> tuple[list[str], list[dict[str, bytes]]]:
    """Each step's global hash and rank 0's per-image columns, to the end of the data (or
    ``steps`` steps)."""
    loaders = [Loader(recipe, r, world, Knobs(workers=workers)) for r in range(world)]
    hashes: list[str] = []
    images: list[dict[str, bytes]] = []
    try:
        for ld in loaders:
            if state is not None:
                ld.load_state_dict(state)
        while steps is None or len(hashes) < steps:
            got = [ld.next_step() for ld in loaders]
            digests = {k: d for s in got for k, d in s.lane_digests.items()}
            hashes.append(global_hash(digests[k] for k in sorted(digests)))
            images.append({n: got[0].columns[n].tobytes() for n in _IMAGE_COLUMNS})
            if steps is None and all(s.ended for s in got):
                break
            assert len(hashes) < 40
    finally:
        for ld in loaders:
            ld.close()
    return hashes, images


def test_step_hashes_are_the_same_for_any_world_and_workers(
        image_corpus: ImageCorpus) -> None:
    recipe = _corpus_recipe(image_corpus)
    hashes, images = _run(recipe, 1, 1)
    assert len(hashes) >= 4
    placed = sum(len(np.frombuffer(i["image_seq"], dtype=np.int32)) for i in images)
    assert placed == 20  # every image of the corpus, once
    assert _run(recipe, 1, 2)[0] == hashes
    assert _run(recipe, 2, 2)[0] == hashes
    assert _run(recipe, 4, 1)[0] == hashes


@pytest.mark.parametrize("world", [1, 2])
def test_a_restore_after_any_step_gives_the_same_hashes_and_image_rows(
        image_corpus: ImageCorpus, world: int) -> None:
    """Resumed from the checkpoint of any step (saved by one rank, loaded by ``world``), the
    steps' hashes and rank 0's per-image columns are those of the unbroken run, byte for
    byte: bestfit's carried documents are re-read and their images processed again."""
    recipe = _corpus_recipe(image_corpus)
    with Loader(recipe, 0, 1, Knobs(workers=2)) as loader:
        states = []
        while True:
            states.append(loader.state_dict())
            if loader.next_step().ended:
                break
    # bestfit holds open sequences at the boundaries: their documents are carried by reference
    assert any("pack" in lane for lane in states[1]["lanes"].values())
    whole_hashes, _ = _run(recipe, 1, 2)
    whole_images = _run(recipe, world, 2)[1]
    for k in range(1, len(whole_hashes)):
        hashes, images = _run(recipe, world, 1, states[k], len(whole_hashes) - k)
        assert hashes == whole_hashes[k:], f"resumed at step {k}"
        assert images == whole_images[k:], f"resumed at step {k}"

"""datalane.engine.images.pipeline.pixels: Pillow's pixel memory as numpy without the GIL-held
copy of ``np.asarray``, and the same bytes as it (docs/vlm.md, Throughput)."""

from __future__ import annotations

import gc

import numpy as np
from PIL import Image

from datalane.engine.images import ImageRule, decode, patchify, process, resize
from datalane.engine.images.pipeline import pixels
from datalane.testing.images import ImageCorpus
from tests.engine.images.conftest import corpus_images


def _pattern(height: int, width: int) -> np.ndarray:
    """Every byte differs from its neighbours' (a channel mixed up would show)."""
    return (np.arange(height * width * 3, dtype=np.int64) % 251).astype(np.uint8).reshape(
        height, width, 3)


def test_an_image_in_one_block_is_a_view_of_pillows_memory() -> None:
    want = _pattern(480, 640)
    got = pixels(Image.fromarray(want))
    assert got.shape == (480, 640, 3) and got.dtype == np.uint8
    assert got.strides == (640 * 4, 4, 1)  # Pillow's 4-byte pixels, the padding byte skipped
    assert not got.flags.owndata
    assert got.tobytes() == want.tobytes()


def test_the_view_outlives_the_image() -> None:
    want = _pattern(64, 96)
    got = pixels(Image.fromarray(want))
    gc.collect()
    for _ in range(8):  # reuse of freed memory would show in the view
        Image.fromarray(255 - want).load()
    assert got.tobytes() == want.tobytes()


def test_an_image_over_one_block_is_copied_by_numpy() -> None:
    """2,100 x 2,100 pixels are 17.6 MB of Pillow's 4-byte pixels, over its 16 MB block: the
    rows are not contiguous, Pillow exports no array, and ``np.asarray`` copies."""
    want = _pattern(2100, 2100)
    got = pixels(Image.fromarray(want))
    assert got.flags.c_contiguous and got.strides == (2100 * 3, 3, 1)
    assert got.tobytes() == want.tobytes()


def test_other_modes_are_numpys() -> None:
    grey = Image.fromarray(_pattern(8, 8)[:, :, 0])
    assert pixels(grey).tobytes() == np.asarray(grey).tobytes()


def test_process_gives_the_patches_of_numpys_copy(image_corpus: ImageCorpus) -> None:
    """Every image of the generated corpus (JPEG, PNG, WebP; resized or not) gives the same
    patch bytes through the view as through ``np.asarray`` (the path before it)."""
    rule = ImageRule()
    for _, data in corpus_images(image_corpus):
        image = resize(decode(data), rule.resize)
        want = patchify(np.asarray(image), rule.patches, repeat_frames=False)
        got = process(data, rule, repeat_frames=False)
        assert got.grid_thw == want.grid_thw
        assert got.values.tobytes() == want.values.tobytes()

"""datalane.engine.images.augment: crops and flips drawn from (seed, lane, document) alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from datalane.engine.images import Augment, augment
from datalane.engine.images.augment import crop_box
from datalane.engine.rng import words
from datalane.spec.errors import ConfigError
from datalane.testing.images import synthetic_image

IMAGE = Image.fromarray(synthetic_image(3, 120, 80))


def _pixels(aug: Augment, seed: int, lane: int, doc: int) -> bytes:
    return np.asarray(augment(IMAGE, aug, seed, lane, doc)).tobytes()


def test_no_augmentation_is_the_image_itself() -> None:
    assert augment(IMAGE, Augment(), 1, 2, 3) is IMAGE


def test_a_sure_flip_is_a_mirror() -> None:
    flipped = np.asarray(augment(IMAGE, Augment(flip=1.0), 1, 0, 0))
    assert np.array_equal(flipped, np.asarray(IMAGE)[:, ::-1])


def test_the_crop_box_by_hand() -> None:
    aug = Augment(crop=0.5)
    # step 0: the smallest crop, 60 x 40 of 120 x 80; left = 7 % 61, top = 100 % 41
    assert crop_box(120, 80, aug, [0, (7 << 32) | 100]) == (7, 18, 67, 58)
    # step 65536: the whole image, one place only
    assert crop_box(120, 80, aug, [65536, (7 << 32) | 100]) == (0, 0, 120, 80)
    # step 32768: half way, 90 x 60
    box = crop_box(120, 80, aug, [32768, 0])
    assert (box[2] - box[0], box[3] - box[1]) == (90, 60)


def test_the_draws_are_the_rng_words_of_the_key() -> None:
    aug = Augment(crop=0.6, flip=0.5)
    draws = words(3, 11, "image-augment", 2, 40)
    expected = IMAGE.crop(crop_box(120, 80, aug, draws))
    if draws[2] % 65536 < 32768:
        expected = expected.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    assert _pixels(aug, 11, 2, 40) == np.asarray(expected).tobytes()


def test_same_key_same_pixels_on_any_thread_other_keys_differ() -> None:
    aug = Augment(crop=0.6, flip=0.5)
    keys = [(s, lane, d) for s in (1, 2) for lane in range(3) for d in range(8)]
    serial = [_pixels(aug, *k) for k in keys]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda k: _pixels(aug, *k), keys * 2))
    assert threaded == serial * 2
    assert len(set(serial)) >= 45  # 48 draws of about 49 scales x places x flips: 47 distinct
    flips = sum(augment(IMAGE, Augment(flip=0.5), 5, 0, d).getpixel((0, 0))
                != IMAGE.getpixel((0, 0)) for d in range(400))
    assert 160 < flips < 240  # about half of 400


@pytest.mark.parametrize("kw", [{"crop": 0.0}, {"crop": 1.5}, {"flip": -0.1}, {"flip": True}])
def test_bad_augmentations_name_their_field(kw: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=f"images.augment.{next(iter(kw))}:"):
        Augment(**kw)

"""unpatchify (datalane/engine/images/patches.py) is patchify's exact inverse: an image's patch
rows back to its pixels at the resized grid, as the model sees them (the sample grid of
docs/vlm.md draws them)."""

from __future__ import annotations

import numpy as np
import pytest

from datalane.engine.images import PatchRule, patchify, unpatchify
from datalane.testing.images import synthetic_image

CLIP = PatchRule(patch_size=14, merge_size=2, mean=(0.48145466, 0.4578275, 0.40821073),
                 std=(0.26862954, 0.26130258, 0.27577711))


def test_unpatchify_inverts_patchify_exactly_on_a_hand_made_image() -> None:
    """A 4 x 4 image of 1-pixel patches, merge 2, every pixel (y, x) = (16y + 4x, 100 + y,
    200 + x): block order reads the four 2 x 2 blocks one after another (0 1 4 5 ...), and
    unpatchify puts every pixel back where it was, from one frame or two, in both orders."""
    pixels = np.array([[[16 * y + 4 * x, 100 + y, 200 + x] for x in range(4)] for y in range(4)],
                      dtype=np.uint8)
    rule = PatchRule(patch_size=1, temporal_patch_size=2, merge_size=2)
    block = patchify(pixels, rule, repeat_frames=False)
    assert block.values[:, 0].tolist() == [0, 4, 16, 20, 8, 12, 24, 28,  # the top two blocks
                                           32, 36, 48, 52, 40, 44, 56, 60]
    for order in ("block", "raster"):
        r = PatchRule(patch_size=1, temporal_patch_size=2, merge_size=2, order=order)
        for repeat in (False, True):
            p = patchify(pixels, r, repeat_frames=repeat)
            assert np.array_equal(unpatchify(p.values, p.grid_thw, r), pixels), (order, repeat)


@pytest.mark.parametrize("rule", [PatchRule(), PatchRule(order="raster"), CLIP,
                                  PatchRule(patch_size=14, temporal_patch_size=1, merge_size=1)])
def test_unpatchify_inverts_patchify_on_a_picture(rule: PatchRule) -> None:
    f = rule.patch_size * rule.merge_size
    pixels = synthetic_image(5, 3 * f, 2 * f)
    p = patchify(pixels, rule)
    assert np.array_equal(unpatchify(p.values, p.grid_thw, rule), pixels)


def test_unpatchify_refuses_rows_that_are_not_the_grids() -> None:
    rule = PatchRule(patch_size=1, temporal_patch_size=2, merge_size=2)
    p = patchify(np.zeros((4, 4, 3), np.uint8), rule)
    with pytest.raises(ValueError, match=r"patch rows uint8 \(15, 6\) are not the 16 uint8 rows "
                                         r"of 3 or 6 values of grid_thw \(1, 4, 4\)"):
        unpatchify(p.values[:15], p.grid_thw, rule)
    with pytest.raises(ValueError, match=r"grid_thw \(2, 4, 4\) is not a still image's grid"):
        unpatchify(p.values, (2, 4, 4), rule)
    with pytest.raises(ValueError, match=r"grid_thw \(1, 3, 4\) is not a still image's grid"):
        unpatchify(p.values[:12], (1, 3, 4), rule)

"""datalane.engine.images.resize: TorchTitan's pixel-budget rule, to the pixel."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from datalane.engine.images import BadImage, ResizeRule, resize, target_size
from datalane.spec.errors import ConfigError

RULES = [ResizeRule(),  # Qwen3.5: 16 x 2, 65,536 .. 16,777,216 pixels
         ResizeRule(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=12845056),
         ResizeRule(patch_size=16, merge_size=1, min_pixels=784, max_pixels=3136)]


def _titan(titan_image: types.ModuleType, h: int, w: int, rule: ResizeRule) -> object:
    try:
        return titan_image.resize_to_pixel_budget(
            h, w, patch_size=rule.patch_size, merge_size=rule.merge_size,
            min_pixels=rule.min_pixels, max_pixels=rule.max_pixels)[:2]
    except ValueError:
        return "image_aspect"


def _ours(h: int, w: int, rule: ResizeRule) -> object:
    try:
        return target_size(h, w, rule)
    except BadImage as e:
        return e.reason


@settings(max_examples=600, derandomize=True, database=None)
@given(h=st.integers(1, 20000), w=st.integers(1, 20000), r=st.sampled_from(range(len(RULES))))
def test_target_size_is_torchtitans_on_any_size(titan_image: types.ModuleType, h: int, w: int,
                                                r: int) -> None:
    rule = RULES[r]
    ours = _ours(h, w, rule)
    assert ours == _titan(titan_image, h, w, rule)
    if min(h, w) >= rule.factor and ours != "image_aspect":  # no pre-scale: plain smart_resize
        assert ours == titan_image.smart_resize(h, w, rule.factor, rule.min_pixels,
                                                rule.max_pixels)


def test_target_size_on_every_small_size(titan_image: types.ModuleType) -> None:
    rule = RULES[0]
    for h in range(1, 80):
        for w in range(1, 80):
            assert _ours(h, w, rule) == _titan(titan_image, h, w, rule), (h, w)


def test_hand_computed_sizes() -> None:
    rule = ResizeRule()
    # 501 x 1001: round(15.66) = 16, round(31.28) = 31 -> 512 x 992 = 507,904, in budget
    assert target_size(501, 1001, rule) == (512, 992)
    # 20 x 30: pre-scaled by 1.6 to 32 x 48, rounded to 32 x 64 (round(1.5) = 2) = 2,048 <
    # 65,536: beta = sqrt(65536 / 1536) = 6.532 -> ceil(6.532) * 32 = 224, ceil(9.798) * 32
    assert target_size(20, 30, rule) == (224, 320)
    # 8000 x 8000 = 64 Mpx > 16,777,216: beta = sqrt(64e6 / 16777216) = 1.953 -> floor(128.0)
    assert target_size(8000, 8000, rule) == (4096, 4096)
    with pytest.raises(BadImage) as e:
        target_size(1, 201 * 32, rule)  # pre-scaled to 32 x 205,824: 6,432 to 1
    assert e.value.reason == "image_aspect"
    assert target_size(1, 200, ResizeRule(size=(64, 96))) == (64, 96)


def test_resize_is_pillows_bicubic_and_a_no_op_at_the_target() -> None:
    pixels = (np.arange(50 * 70 * 3) % 253).astype(np.uint8).reshape(50, 70, 3)
    image = Image.fromarray(pixels)
    small = ResizeRule(patch_size=8, merge_size=2, min_pixels=256, max_pixels=4096)
    out = resize(image, small)
    assert out.size == (64, 48)  # (width, height): round(50 / 16) = 3, round(70 / 16) = 4
    assert np.array_equal(np.asarray(out),
                          np.asarray(image.resize((64, 48), Image.Resampling.BICUBIC)))
    assert resize(out, small) is out


@pytest.mark.parametrize("kw,field", [({"patch_size": 0}, "patch_size"),
                                      ({"merge_size": True}, "merge_size"),
                                      ({"min_pixels": 10, "max_pixels": 9}, "min_pixels"),
                                      ({"min_pixels": 1, "max_pixels": 1000}, "max_pixels"),
                                      ({"size": (64, 90)}, "size"),
                                      ({"size": (64,)}, "size")])
def test_bad_rules_name_their_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"images.{field}:"):
        ResizeRule(**kw)  # type: ignore[arg-type]

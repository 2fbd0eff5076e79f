"""A resize has a bound (review finding 10): a recipe's fixed ``resize.size`` and its budget's
``max_pixels`` are refused over ``MAX_RESIZE_PIXELS`` (33,554,432) when the recipe loads,
naming the field and the value, and an image the rule would still put over it is set aside as
``image_too_large`` before a pixel is made (datalane/spec/limits.py)."""

from __future__ import annotations

from typing import Any

import pytest
from PIL import Image

from datalane.engine.images import BadImage, ResizeRule, resize, target_size
from datalane.spec.errors import ConfigError
from datalane.spec.limits import MAX_RESIZE_PIXELS
from datalane.spec.recipe import load_recipe


def _load(vision: dict[str, Any]) -> Any:
    return load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 64,
                        "tokenizer": {"uri": "t.json"}, "packing": {"algorithm": "bestfit"},
                        "sources": [{"name": "p", "uris": ["x.tar"], "vision": vision}]})


@pytest.mark.parametrize(("resize", "match"), [
    ({"size": [100000, 100000]},
     r"^sources\[0\]\.vision\.resize\.size \[100000, 100000\] is 10,000,000,000 pixels, over "
     r"the 33,554,432 an image may be resized to$"),
    ({"size": [5824, 5792]},  # one row of merged patches over
     r"^sources\[0\]\.vision\.resize\.size \[5824, 5792\] is 33,732,608 pixels"),
    ({"max_pixels": 10 ** 10},
     r"^sources\[0\]\.vision\.resize\.max_pixels 10000000000 must be <= 33554432"),
])
def test_a_recipe_asking_for_a_resize_over_the_bound_is_refused_naming_it(
        resize: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _load({"resize": resize})


def test_a_resize_at_the_bound_loads() -> None:
    assert 5792 * 5792 <= MAX_RESIZE_PIXELS == 33_554_432
    assert _load({"resize": {"size": [5792, 5792]}}).sources[0].vision.resize.size == [5792, 5792]
    _load({"resize": {"max_pixels": MAX_RESIZE_PIXELS}})


@pytest.mark.parametrize(("rule", "match"), [
    ({"size": (65536, 65536)}, r"images\.size: \(65536, 65536\) is over the 33,554,432 pixels"),
    ({"max_pixels": 1 << 26}, r"images\.max_pixels: 67,108,864 is over the 33,554,432"),
])
def test_the_engines_rule_has_the_same_bound(rule: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ResizeRule(**rule)


def test_an_image_the_rule_puts_over_the_bound_is_too_large_before_it_is_resized() -> None:
    # 64-pixel patches merged 16 x 16: a side is at least one 1,024-pixel merged patch. A
    # 2000 x 10 strip is scaled up to 204,800 x 1,024 (TorchTitan's pre-scale), then shrunk by
    # beta = sqrt(204800 * 1024 / 2**25) = 2.5 to 81,920 x 1,024 (the short side floors at one
    # merged patch): 83,886,080 pixels, over the budget's max_pixels and the bound
    rule = ResizeRule(patch_size=64, merge_size=16, min_pixels=1 << 20, max_pixels=1 << 25)
    assert target_size(10, 2000, rule) == (1024, 81920)  # TorchTitan's arithmetic, unchanged
    with pytest.raises(BadImage) as e:
        resize(Image.new("RGB", (2000, 10)), rule)
    assert e.value.reason == "image_too_large"
    assert e.value.detail == ("2000 x 10 pixels would be resized to 81920 x 1024, over the "
                              "33,554,432 pixels an image may be resized to")
    # an ordinary image under the same rule: 200 x 300 grows to the budget's 1,024 x 2,048
    assert resize(Image.new("RGB", (200, 300)), rule).size == (1024, 2048)

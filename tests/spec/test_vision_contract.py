"""The vision contract (datalane/spec/visioncontract.py): what a vision recipe's schema carries
for the trainer besides its columns (token ids, patch rule), checked field by field because a
sidecar announces it; the recipe's `image_mean` / `image_std` settings it takes the
normalisation from, which leave every other recipe's canonical form (and fingerprint) as it
was."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from datalane.spec import imagecolumns
from datalane.spec.errors import ConfigError
from datalane.spec.model import dump, load
from datalane.spec.schema import Column, text_schema
from datalane.spec.vision import VisionSpec
from datalane.spec.visioncontract import VisionContract

# tests/data/vision/tokenizer.json's ids; Qwen3.5's patch rule
QWEN = VisionContract(1024, 1025, 1026, 1027, 1, 16, 2, 2, "block", (0.5, 0.5, 0.5),
                      (0.5, 0.5, 0.5))
LOSS_MASK = Column("loss_mask", "uint8", pad=0, default=1)


def test_the_contract_names_torchtitans_special_tokens() -> None:
    assert QWEN.special_tokens == {"image_id": 1024, "video_id": 1025, "vision_start_id": 1026,
                                   "vision_end_id": 1027, "pad_id": 1}
    assert QWEN.patch_width == 768  # 3 x 16 x 16 bytes: one frame
    assert replace(QWEN, video_id=-1).special_tokens["video_id"] == -1  # no <|video_pad|>
    # the pad may be another special token (the lanes pad with EOS without a pad token)
    assert replace(QWEN, pad_id=0, video_id=-1).pad_id == 0
    # the bounds themselves are fine
    assert replace(QWEN, image_mean=(-1e6, 1e6, 0), image_std=(1e-6, 1e-6, 1e-6)).image_std[0] \
        == 1e-6


@pytest.mark.parametrize("change,message", [
    ({"image_id": -1}, r"image_id -1 is not a token id \(an integer in 0\.\.2147483647\)"),
    ({"video_id": -2}, r"video_id -2 is not a token id \(an integer in -1\.\.2147483647\)"),
    ({"pad_id": 2 ** 31}, r"pad_id 2147483648 is not a token id"),
    ({"vision_end_id": True}, r"vision_end_id True is not a token id"),
    ({"vision_end_id": 1024}, r"image_id, vision_start_id and vision_end_id \(1024, 1026, "
                              r"1024\) must be three different tokens"),
    ({"pad_id": 1024}, r"pad_id 1024 is also image_id: the vision tokens, the video "
                       r"placeholder and the pad must be different tokens"),
    ({"pad_id": 1025}, r"pad_id 1025 is also video_id"),
    ({"pad_id": 1027}, r"pad_id 1027 is also vision_end_id"),
    ({"video_id": 1024}, r"video_id 1024 is also image_id"),
    ({"video_id": 1026}, r"video_id 1026 is also vision_start_id"),
    ({"patch_size": 0}, r"patch_size 0 is not an integer in 1\.\.1024"),
    ({"temporal_patch_size": 17}, r"temporal_patch_size 17 is not an integer in 1\.\.16"),
    ({"merge_size": 2.0}, r"merge_size 2\.0 is not an integer in 1\.\.16"),
    ({"order": "zigzag"}, r"order 'zigzag' is not 'block' or 'raster'"),
    ({"image_mean": (0.5, 0.5)}, r"image_mean \(0\.5, 0\.5\) is not three finite numbers"),
    ({"image_mean": (0.5, float("nan"), 0.5)}, r"image_mean \(0\.5, nan, 0\.5\) is not three "
                                               r"finite numbers"),
    ({"image_std": (0.5, 0.0, 0.5)}, r"image_std \(0\.5, 0\.0, 0\.5\) has a value that is not "
                                     r"positive"),
    # 1 / 5e-324 is inf: every pixel would be
    ({"image_std": (0.5, 5e-324, 0.5)}, r"image_std \(0\.5, 5e-324, 0\.5\) has a value below "
                                        r"1e-06 \(the pixels are divided by it\)"),
    ({"image_mean": (0.5, 1e308, 0.5)}, r"image_mean \(0\.5, 1e\+308, 0\.5\) has a value "
                                        r"outside -1e\+06\.\.1e\+06"),
])
def test_a_malformed_contract_is_refused_naming_the_field_and_value(
        change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(QWEN, **change)


def test_the_schema_carries_the_contract_only_with_image_columns_that_fit_it() -> None:
    columns = (*imagecolumns.columns(768, 2), LOSS_MASK)
    schema = text_schema(1, columns, QWEN)
    assert schema.vision == QWEN
    # not in the columns' JSON (an older client parses it strictly): the wire sends it apart
    assert schema.dumps() == text_schema(1, columns).dumps()
    assert "image_id" not in schema.dumps()
    with pytest.raises(ValueError, match="a sample schema without per-image columns has a "
                                         "vision contract"):
        text_schema(1, (LOSS_MASK,), QWEN)
    with pytest.raises(ValueError, match=r"column 'image_patches' has rows of 768 bytes, 4 to a "
                                         r"placeholder; the vision contract's patch_size 14 and "
                                         r"merge_size 2 make 588 and 4"):
        text_schema(1, columns, replace(QWEN, patch_size=14))
    with pytest.raises(ValueError, match=r"rows of 768 bytes, 4 to a placeholder; .* "
                                         r"merge_size 3 make 768 and 9"):
        text_schema(1, columns, replace(QWEN, merge_size=3))
    with pytest.raises(ValueError, match=r"column 'input_ids' is padded with 7; the vision "
                                         r"contract's pad_id is 1"):
        text_schema(7, columns, QWEN)


def test_image_mean_and_std_are_three_numbers_std_positive_and_qwens_by_default() -> None:
    spec = load(VisionSpec, {}, "sources[0].vision")
    assert (spec.image_mean, spec.image_std) == ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    # left out of the canonical form at their defaults: vision recipes keep their fingerprint
    assert "image_mean" not in dump(spec) and "image_std" not in dump(spec)
    clip = load(VisionSpec, {"image_mean": [0.48145466, 0.4578275, 0.40821073],
                             "image_std": [0.26862954, 0.26130258, 0.27577711]})
    assert dump(clip)["image_std"] == [0.26862954, 0.26130258, 0.27577711]
    assert load(VisionSpec, {"image_mean": [0, 1, 0]}).image_mean == [0.0, 1.0, 0.0]
    for bad, message in (
            ({"image_mean": [0.5, 0.5]}, r"sources\[0\]\.vision\.image_mean \[0\.5, 0\.5\] is "
                                         r"not three numbers \(R, G, B\)"),
            ({"image_std": [0.5, 0.5, 0.5, 0.5]}, r"vision\.image_std \[0\.5, 0\.5, 0\.5, 0\.5\] "
                                                  r"is not three numbers"),
            ({"image_std": [0.5, -0.1, 0.5]}, r"sources\[0\]\.vision\.image_std \[0\.5, -0\.1, "
                                              r"0\.5\] has a value that is not positive"),
            ({"image_std": [0.5, 0, 0.5]}, r"image_std \[0\.5, 0\.0, 0\.5\] has a value that is "
                                           r"not positive"),
            ({"image_mean": [0.5, "x", 0.5]}, r"sources\[0\]\.vision\.image_mean\[1\] must be a "
                                              r"number, got 'x'"),
            ({"image_mean": [0.5, float("inf"), 0.5]}, r"image_mean\[1\] must be a finite "
                                                       r"number, got inf"),
            ({"image_std": [0.5, 5e-324, 0.5]}, r"sources\[0\]\.vision\.image_std \[0\.5, "
                                                r"5e-324, 0\.5\] has a value below 1e-06"),
            ({"image_mean": [0.5, -1e308, 0.5]}, r"sources\[0\]\.vision\.image_mean \[0\.5, "
                                                 r"-1e\+308, 0\.5\] has a value outside "
                                                 r"-1e\+06\.\.1e\+06")):
        with pytest.raises(ConfigError, match=message):
            load(VisionSpec, bad, "sources[0].vision")

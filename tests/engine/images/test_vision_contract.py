"""The plan puts a vision recipe's contract in its sample schema (datalane/engine/plan.py,
engine/documents/vision.py): the ids its tokenizer gives the names of its `vision` settings,
the tokenizer's pad, and the patch rule with the recipe's `image_mean` / `image_std`; every
source that renders images must agree; a text recipe's schema has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from datalane.engine.plan import Plan
from datalane.spec.errors import ConfigError
from datalane.spec.model import dump
from datalane.spec.recipe import load_recipe
from tests.support.kinds import VISION_TOKENIZER
from tests.support.vision import encoded, vision_recipe, write_shard


@pytest.fixture
def shard(tmp_path: Path) -> str:
    write_shard(tmp_path / "pairs.tar", [[("jpg", encoded(96, 64, "JPEG", 1)), ("txt", b"a")]])
    return str(tmp_path / "pairs.tar")


def test_a_vision_plans_schema_carries_the_recipes_tokens_and_patch_rule(shard: str) -> None:
    plan = Plan.build(vision_recipe([shard], 150))
    v = plan.schema.vision
    assert v is not None
    # tests/data/vision/tokenizer.json: <|image_pad|> 1024, <|video_pad|> 1025,
    # <|vision_start|> 1026, <|vision_end|> 1027; no pad token, so the lanes pad with EOS (1)
    assert v.special_tokens == {"image_id": 1024, "video_id": 1025, "vision_start_id": 1026,
                                "vision_end_id": 1027, "pad_id": 1}
    assert plan.schema.column("input_ids").pad == 1
    assert (v.patch_size, v.temporal_patch_size, v.merge_size, v.order) == (16, 2, 2, "block")
    assert (v.image_mean, v.image_std) == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


def test_the_contract_follows_the_vision_settings(shard: str) -> None:
    recipe = vision_recipe([shard], 150, sources=[{
        "name": "pairs", "uris": [shard],
        "vision": {"temporal_patch_size": 1, "merge_size": 1, "order": "raster",
                   "image_token": "<|video_pad|>", "image_mean": [0.1, 0.2, 0.3],
                   "image_std": [0.4, 0.5, 0.6]}}])
    v = Plan.build(recipe).schema.vision
    assert v is not None
    # the names the recipe gives; <|video_pad|> renders its images, so no video placeholder
    # (one id for both would make TorchTitan count each image placeholder as a video's too)
    assert (v.image_id, v.video_id) == (1025, -1)
    assert (v.temporal_patch_size, v.merge_size, v.order) == (1, 1, "raster")
    assert (v.image_mean, v.image_std) == ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))


def test_sources_that_disagree_on_the_contract_are_refused_naming_both(shard: str) -> None:
    recipe = vision_recipe([shard], 150, sources=[
        {"name": "a", "uris": [shard], "vision": {}},
        {"name": "b", "uris": [shard], "vision": {"image_std": [0.5, 0.5, 0.25]}}])
    with pytest.raises(ConfigError, match=r"sources 'a' and 'b' give different vision tokens "
                                          r"or patching \(image_std \(0\.5, 0\.5, 0\.5\) and "
                                          r"\(0\.5, 0\.5, 0\.25\)\): one batch"):
        Plan.build(recipe)


def test_a_pad_that_is_a_vision_token_is_refused_naming_it(shard: str) -> None:
    recipe = load_recipe({**dump(vision_recipe([shard], 150)), "tokenizer": {
        "uri": str(VISION_TOKENIZER), "pad_token": "<|vision_start|>"}})
    with pytest.raises(ConfigError, match=r"sources\[0\]\.vision: the vision contract with "
                                          r".*tokenizer\.json: pad_id 1026 is also "
                                          r"vision_start_id"):
        Plan.build(recipe)


def test_a_text_plans_schema_has_no_contract(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 16,
                          "tokenizer": {"uri": str(VISION_TOKENIZER)},
                          "sources": [{"name": "t", "uris": [str(tmp_path / "a.jsonl")]}]})
    assert Plan.build(recipe).schema.vision is None


def test_sources_cutting_patches_of_another_size_are_refused_naming_the_column(
        shard: str) -> None:
    """A source cutting patches of 14 pixels, not 16, gives the sample's patch column rows of
    another width: refused before the contracts are compared, naming the column and both."""
    recipe = vision_recipe([shard], 150, sources=[
        {"name": "a", "uris": [shard], "vision": {}},
        {"name": "b", "uris": [shard], "vision": {"patch_size": 14}}])
    with pytest.raises(ConfigError) as err:
        Plan.build(recipe)
    msg = str(err.value)
    mine, _, earlier = msg.partition("; an earlier source")
    # rows of 3 * 14 * 14 = 588 values against 3 * 16 * 16 = 768
    assert mine.startswith("sources[1] gives the sample column 'image_patches' as {") and (
        "'width': 588" in mine) and "'width': 768" in earlier and msg.endswith(
        ": every source of a recipe must agree"), msg

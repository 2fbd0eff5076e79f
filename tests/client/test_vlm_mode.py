"""The loaders' VLM mode: ``DataLaneDataset(loader, vlm=True)`` and TorchTitan's
``DataLaneDataLoader`` over a vision recipe yield ``to_vlm``'s ``(input_dict, labels)``, the
special-token ids read from the recipe's tokenizer by its ``vision`` names and the patch rule
from its ``vision`` settings (datalane/client/torch.py, datalane/client/torchtitan.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.client import InProcessLoader
from datalane.spec.errors import ConfigError, MismatchError
from datalane.spec.knobs import Knobs
from datalane.spec.recipe import load_recipe
from datalane.testing.images import ImageCorpus, make_image_corpus

torch = pytest.importorskip("torch")

# tests/data/vision/tokenizer.json (the corpus's tokenizer): Qwen's vision tokens added after
# datalane's 1,024; no pad token, so the lanes pad with EOS (1)
IMAGE, VIDEO, START, END, EOS = 1024, 1025, 1026, 1027, 1
SPECIAL = {"image_id": IMAGE, "video_id": VIDEO, "vision_start_id": START,
           "vision_end_id": END, "pad_id": EOS}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> ImageCorpus:
    return make_image_corpus(str(tmp_path_factory.mktemp("vlm-mode")), images=8, per_shard=4)


def _recipe(corpus: ImageCorpus, **vision: Any) -> Any:
    """2 lanes, 2 sequences of 256 tokens a step; every image resized to 64 x 64 (grid
    (1, 4, 4): 4 placeholders) so a document is its 6 vision tokens, caption and EOS."""
    return load_recipe({
        "lanes": 2, "global_batch_size": 2, "seq_len": 255, "packing": {"algorithm": "bestfit"},
        "tokenizer": {"uri": corpus.tokenizer}, "shuffle": {"block_size": 1},
        "sources": [{"name": "pairs", "uris": corpus.shards,
                     "vision": {"resize": {"size": [64, 64]}, **vision}}]})


def test_the_dataset_yields_torchtitans_batch_with_the_recipes_tokens(
        corpus: ImageCorpus) -> None:
    from datalane.client.torch import DataLaneDataset
    from datalane.client.torchvlm import to_vlm

    recipe = _recipe(corpus)
    with InProcessLoader(recipe, 0, 1, 1, Knobs(workers=2)) as plain:
        batches = [b for b, _ in zip(plain, range(2), strict=False)]
    with InProcessLoader(recipe, 0, 1, 1, Knobs(workers=2)) as loader:
        dataset = DataLaneDataset(loader, vlm=True)
        assert dataset.vlm is not None and dataset.vlm.special_tokens == SPECIAL
        items = [item for item, _ in zip(dataset, range(2), strict=False)]
    for batch, (inputs, labels) in zip(batches, items, strict=True):
        assert isinstance(inputs, dict) and set(inputs) >= {
            "input", "positions", "pixel_values", "grid_thw", "special_tokens",
            "mrope_positions"}
        assert inputs["special_tokens"] == SPECIAL
        want_inputs, want_labels = to_vlm(batch.columns, SPECIAL)
        for key, want in want_inputs.items():
            got = inputs[key]
            if isinstance(want, torch.Tensor):
                assert got.dtype == want.dtype and torch.equal(got, want), key
            else:
                assert got == want, key
        assert torch.equal(labels, want_labels)
        # every image of the row is 64 x 64 pixels: 16 patches of 3 x 2 x 16 x 16 values
        n = len(batch.columns["image_grid_thw"])
        assert n > 0 and inputs["grid_thw"].tolist() == [[1, 4, 4]] * n
        assert inputs["pixel_values"].shape == (n, 16, 1536)
        ids = inputs["input"][0]
        assert int((ids == IMAGE).sum()) == 4 * n and int((ids == START).sum()) == n
        assert (labels[0][:-1][ids[1:] == IMAGE] == -100).all()  # label j: token j + 1


def test_the_patch_rule_comes_from_the_vision_settings(corpus: ImageCorpus) -> None:
    from datalane.client.torch import DataLaneDataset

    recipe = _recipe(corpus, temporal_patch_size=1)
    with InProcessLoader(recipe, 0, 1, 1, Knobs(workers=2)) as loader:
        dataset = DataLaneDataset(loader, vlm=True)
        assert dataset.vlm is not None and dataset.vlm.rule.temporal_patch_size == 1
        inputs, _ = next(iter(dataset))
    # one frame: 3 x 1 x 16 x 16 values a patch, not Qwen3.5's repeated 1,536
    assert inputs["pixel_values"].shape[1:] == (16, 768)


def test_a_contract_that_changed_before_the_first_open_is_refused_naming_both(
        corpus: ImageCorpus) -> None:
    """VLM mode reads the contract before the first microbatch (a SidecarLoader: from the
    sidecar's Health); a sidecar restarted with another recipe before the first Open would
    serve batches for another normalisation. The first microbatch's schema (the Open reply's)
    is compared with it: a MismatchError naming both, not silently stale mean and std."""
    from dataclasses import replace

    from datalane.client.torch import DataLaneDataset

    with InProcessLoader(_recipe(corpus), 0, 1, 1, Knobs(workers=2)) as inproc:
        served = inproc.schema
        assert served.vision is not None
        health = replace(served, vision=replace(served.vision, image_std=(0.25, 0.5, 0.5)))

        class Restarted:  # Health's schema before the first microbatch, Open's after
            lanes, lanes_total, socket = inproc.lanes, inproc.lanes_total, "/run/dl.sock"
            schema = health

            def __iter__(self) -> Any:
                for batch in inproc:
                    self.schema = served
                    yield batch

        dataset = DataLaneDataset(Restarted(), vlm=True)  # type: ignore[arg-type]
        assert dataset.vlm is not None and dataset.vlm.rule.std == (0.25, 0.5, 0.5)
        with pytest.raises(MismatchError, match=(
                r"the vision contract the sidecar at /run/dl\.sock announces with the first "
                r"microbatch is not the one DataLaneDataset was built with \(image_std "
                r"\(0\.25, 0\.5, 0\.5\) then \(0\.5, 0\.5, 0\.5\)\): restarted with another "
                r"recipe")):
            next(iter(dataset))
        # the same contract: served
        same = DataLaneDataset(inproc, vlm=True)
        inputs, _ = next(iter(same))
        assert inputs["special_tokens"] == SPECIAL


def test_vlm_mode_is_refused_where_it_cannot_hold(corpus: ImageCorpus, tmp_path: Path) -> None:
    from datalane.client.torch import DataLaneDataset

    text = tmp_path / "a.jsonl"
    text.write_text('{"text": "hello there"}\n')
    recipe = load_recipe({"lanes": 1, "global_batch_size": 1, "seq_len": 16,
                          "tokenizer": {"uri": corpus.tokenizer},
                          "sources": [{"name": "t", "uris": [str(text)]}]})
    with InProcessLoader(recipe, 0, 1, 1) as loader, pytest.raises(
            ConfigError, match=r"no per-image columns \(its columns \['input_ids', "
                               r"'positions'\]: no source has `vision` settings\)"):
        DataLaneDataset(loader, vlm=True)
    with InProcessLoader(_recipe(corpus), 0, 1, 1) as loader:
        with pytest.raises(ConfigError, match="global_tokens=True"):
            DataLaneDataset(loader, vlm=True, global_tokens=True)

        class Bare:  # a loader without a sample schema
            lanes, lanes_total = loader.lanes, loader.lanes_total

        with pytest.raises(ConfigError, match="has no sample schema: pass vlm=vlm_settings"):
            DataLaneDataset(Bare(), vlm=True)  # type: ignore[arg-type]


def test_torchtitans_dataloader_turns_vlm_mode_on_for_a_vision_recipe(
        corpus: ImageCorpus, tmp_path: Path) -> None:
    pytest.importorskip("torchtitan")
    import json

    from datalane.client.torchtitan import DataLaneDataLoader

    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({
        "lanes": 2, "global_batch_size": 2, "seq_len": 255, "packing": {"algorithm": "bestfit"},
        "tokenizer": {"uri": corpus.tokenizer}, "shuffle": {"block_size": 1},
        "sources": [{"name": "pairs", "uris": corpus.shards,
                     "vision": {"resize": {"size": [64, 64]}}}]}))
    dl = DataLaneDataLoader(DataLaneDataLoader.Config(recipe=str(path)), dp_world_size=2,
                            dp_rank=1, seq_len=255, local_batch_size=1)
    try:
        assert dl.vlm
        inputs, labels = next(iter(dl))
        assert inputs["special_tokens"] == SPECIAL and labels.shape == (1, 255)
        assert inputs["grid_thw"].tolist()[0] == [1, 4, 4]
        assert np.all(inputs["mrope_positions"].numpy() >= 0)
        with pytest.raises(ConfigError, match=r"training\.seq_len is 254"):
            dl.seq_len = 254
            next(iter(dl))
    finally:
        dl.close()


def test_torchtitans_dataloader_refuses_a_sidecar_without_the_vision_contract(
        corpus: ImageCorpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sidecar that announces the image columns but not the vision contract (one that
    predates it) is refused, naming what is missing, and the loader is closed; not served as
    text batches without their images."""
    pytest.importorskip("torchtitan")
    from dataclasses import replace

    from datalane.client import torchtitan

    with InProcessLoader(_recipe(corpus), 0, 1, 1) as inproc:
        schema = inproc.schema
    assert schema.vision is not None and schema.vision.special_tokens == SPECIAL
    closed: list[bool] = []

    class Announced:  # what DataLaneDataLoader reads of a SidecarLoader before iterating
        lanes, lanes_total, per_step, socket = range(2), 2, 2, "/run/old.sock"

        def __init__(self) -> None:
            self.schema = replace(schema, vision=None)

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(torchtitan, "_open_loader", lambda *args: Announced())
    with pytest.raises(MismatchError, match=(
            r"the sample schema the sidecar at /run/old\.sock announces has the per-image "
            r"columns \['image_patches', .*'image_patch_start'\] but no vision contract: the "
            r"ids image_id, video_id, vision_start_id, vision_end_id, pad_id and the patch rule "
            r"\(patch_size, temporal_patch_size, merge_size, order, image_mean, image_std\).*"
            r"upgrade the sidecar")):
        torchtitan.DataLaneDataLoader(torchtitan.DataLaneDataLoader.Config(socket="/x"),
                                      dp_world_size=1, dp_rank=0, seq_len=255,
                                      local_batch_size=1)
    assert closed == [True]


def test_torchtitans_dataloader_closes_a_sidecar_whose_schema_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the schema itself can fail (a malformed vision contract in the sidecar's Health
    is a MismatchError): the loader's channel is closed all the same."""
    pytest.importorskip("torchtitan")
    from datalane.client import torchtitan

    closed: list[bool] = []

    class Malformed:
        lanes, lanes_total, per_step, socket = range(2), 2, 2, "/run/bad.sock"

        @property
        def schema(self) -> Any:
            raise MismatchError("the Health of the sidecar at /run/bad.sock: vision: pad_id 1024 "
                                "is also image_id")

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(torchtitan, "_open_loader", lambda *args: Malformed())
    with pytest.raises(MismatchError, match=r"pad_id 1024 is also image_id"):
        torchtitan.DataLaneDataLoader(torchtitan.DataLaneDataLoader.Config(socket="/x"),
                                      dp_world_size=1, dp_rank=0, seq_len=255,
                                      local_batch_size=1)
    assert closed == [True]

"""VLM mode through a real sidecar (datalane/client/torch.py, client/torchtitan.py): the sidecar
announces the recipe's vision contract at Open, so TorchTitan's ``DataLaneDataLoader`` and
``DataLaneDataset(vlm=True)`` over a ``SidecarLoader`` yield TorchTitan's multimodal
``(input_dict, labels)`` bit for bit as in-process, with the recipe's own tokens and patch
rule (here a non-default normalisation, so a client that fell back to Qwen3.5's would
differ)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import yaml

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.spec.knobs import Knobs
from datalane.testing.images import make_image_corpus

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # real sidecar processes

MEAN, STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
# tests/data/vision/tokenizer.json (the corpus's): the lanes pad with EOS (1)
SPECIAL = {"image_id": 1024, "video_id": 1025, "vision_start_id": 1026, "vision_end_id": 1027,
           "pad_id": 1}


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """12 generated images (JPEG, PNG, WebP) resized to 64 x 64; 2 lanes of 2 sequences of
    256 tokens a step; CLIP's mean and std."""
    root = tmp_path_factory.mktemp("vlm")
    corpus = make_image_corpus(str(root), images=12, per_shard=6)
    recipe = {"lanes": 2, "global_batch_size": 4, "seq_len": 255,
              "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
              "shuffle": {"block_size": 2},
              "sources": [{"name": "pairs", "uris": corpus.shards, "chunk_rows": 3,
                           "vision": {"resize": {"size": [64, 64]}, "image_mean": MEAN,
                                      "image_std": STD}}]}
    out = root / "vlm.yaml"
    out.write_text(yaml.safe_dump(recipe))
    return str(out)


def _same(got: tuple[dict[str, Any], Any], want: tuple[dict[str, Any], Any]) -> None:
    (gi, gl), (wi, wl) = got, want
    assert list(gi) == list(wi)
    for key, w in wi.items():
        g = gi[key]
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape, key
            assert g.numpy().tobytes() == w.numpy().tobytes(), key  # bit for bit
        else:
            assert g == w, key
    assert gl.dtype == wl.dtype and torch.equal(gl, wl)


@pytest.mark.parametrize("transport,flags", [("shm", ()), ("inline", ()),
                                             ("shm", ("--rank-processes", "1"))])
def test_the_dataset_in_vlm_mode_through_a_sidecar_is_the_in_process_one(
        sidecar, recipe_path, transport, flags) -> None:
    """Inline, through the ring, and from a rank worker process of the sidecar."""
    from datalane.client.torch import DataLaneDataset

    sc = sidecar(recipe_path, *flags)
    with SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=1,
                       transport=transport) as loader:
        dataset = DataLaneDataset(loader, vlm=True)
        assert dataset.vlm is not None and dataset.vlm.special_tokens == SPECIAL
        assert dataset.vlm.rule.mean == tuple(MEAN) and dataset.vlm.rule.std == tuple(STD)
        got = [item for item, _ in zip(dataset, range(6), strict=False)]  # 3 steps
    with InProcessLoader(load_recipe(recipe_path), 1, 2, 1, Knobs(workers=2)) as inproc:
        want = [item for item, _ in zip(DataLaneDataset(inproc, vlm=True), range(6),
                                        strict=False)]
    assert sum(int(w[0]["grid_thw"].shape[0]) for w in want if w[0]["grid_thw"] is not None) > 2
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    # the recipe's normalisation, not Qwen3.5's, by hand on the first image's first patch row:
    # channel c of byte v is (v * float32(1/255) - mean[c]) / std[c], each of the rows' 256
    # values per channel twice (temporal_patch_size 2: the one frame repeated)
    with InProcessLoader(load_recipe(recipe_path), 1, 2, 1, Knobs(workers=2)) as plain:
        k, batch = next((k, b) for k, b in enumerate(plain) if len(b.columns["image_seq"]))
    row = batch.columns["image_patches"][0].reshape(3, 256).astype(np.float32)
    pixels = want[k][0]["pixel_values"][0, 0].numpy().reshape(3, 2, 256)
    for c in range(3):
        hand = (row[c] * np.float32(1 / 255) - np.float32(MEAN[c])) / np.float32(STD[c])
        assert np.array_equal(pixels[c, 0], hand) and np.array_equal(pixels[c, 1], hand)


def test_torchtitans_dataloader_reads_a_vision_recipe_from_the_sidecar(
        sidecar, recipe_path) -> None:
    pytest.importorskip("torchtitan")
    from datalane.client.torchtitan import DataLaneDataLoader

    sc = sidecar(recipe_path)
    kwargs = {"dp_world_size": 2, "dp_rank": 0, "seq_len": 255, "local_batch_size": 1}
    remote = DataLaneDataLoader(DataLaneDataLoader.Config(socket=sc.socket), **kwargs)
    local = DataLaneDataLoader(DataLaneDataLoader.Config(recipe=recipe_path), **kwargs)
    try:
        assert remote.vlm and local.vlm
        got = [item for item, _ in zip(remote, range(4), strict=False)]
        want = [item for item, _ in zip(local, range(4), strict=False)]
        for g, w in zip(got, want, strict=True):
            _same(g, w)
        assert got[0][0]["special_tokens"] == SPECIAL
        assert any("mrope_positions" in g[0] for g in got)  # a batch with images
    finally:
        remote.close()
        local.close()

"""Per-image columns through a real sidecar (datalane/wire/layout.py): a vision recipe's
microbatches reach the client, inline and through the shared-memory ring, column for column
and byte for byte those of the in-process loader."""

from __future__ import annotations

import os

import grpc
import pytest
import yaml

from datalane import load_recipe
from datalane.client import InProcessLoader, SidecarLoader
from datalane.spec import imagecolumns
from datalane.testing.images import make_image_corpus
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg
from tests.sidecar.test_columns import _take

pytestmark = pytest.mark.slow  # real sidecar processes


@pytest.fixture(scope="module")
def vision_recipe_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """12 generated images in 2 shards; 2 lanes of 2 sequences of 1,280 tokens a step."""
    root = tmp_path_factory.mktemp("images")
    corpus = make_image_corpus(str(root), images=12, per_shard=6)
    recipe = {"lanes": 2, "global_batch_size": 4, "seq_len": 1279,
              "tokenizer": {"uri": corpus.tokenizer}, "packing": {"algorithm": "bestfit"},
              "shuffle": {"block_size": 4},
              "sources": [{"name": "pairs", "uris": [f"{corpus.root}/*.tar"], "vision": {},
                           "chunk_rows": 3}]}
    out = root / "vision.yaml"
    out.write_text(yaml.safe_dump(recipe))
    return str(out)


def test_the_reply_to_open_lays_out_the_image_columns_at_capacity(
        sidecar, vision_recipe_path) -> None:
    sc = sidecar(vision_recipe_path)
    with grpc.insecure_channel(f"unix://{os.path.abspath(sc.socket)}") as channel:
        reply = pbg.DataLaneStub(channel).Open(pb.OpenRequest(
            protocol_version=2, rank=0, world_size=1, microbatch_size=2, from_start=True,
            transport=pb.TRANSPORT_SHM), timeout=60)
    # 2 sequences of 1,280 tokens after the 16-byte header of the image counts: 10,240 bytes
    # per int32 column, the mask's 2,560; then at most 2 x 1,279 x 4 patch rows of 768 bytes
    # and 2 x 426 images
    got = [(f.name, f.offset, f.nbytes, list(f.shape)) for f in reply.layout]
    assert got == [
        ("input_ids", 16, 10240, [2, 1280]), ("positions", 10256, 10240, [2, 1280]),
        ("loss_mask", 20496, 2560, [2, 1280]),
        ("image_patches", 23056, 10232 * 768, [10232, 768]),
        ("image_grid_thw", 23056 + 7858176, 852 * 12, [852, 3]),
        ("image_seq", 7891456, 3408, [852]), ("image_offset", 7894864, 3408, [852]),
        ("image_patch_start", 7898272, 853 * 8, [853])]
    assert reply.slot_bytes == 7898272 + 6824


@pytest.mark.parametrize("transport,copy", [("inline", True), ("shm", True), ("shm", False)])
def test_a_vision_stream_through_the_sidecar_is_the_in_process_one(
        sidecar, vision_recipe_path, transport, copy) -> None:
    sc = sidecar(vision_recipe_path)
    with SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=1,
                       transport=transport, copy=copy) as loader:
        got = _take(loader, 8)  # 4 steps of 2 microbatches
    want = _take(InProcessLoader(load_recipe(vision_recipe_path), 1, 2, 1), 8)
    assert sum(len(b.columns["image_seq"]) for b in want) > 2  # images, and more than one
    for a, b in zip(got, want, strict=True):
        assert (a.step, a.index, a.lane_digests) == (b.step, b.index, b.lane_digests)
        assert list(a.columns) == list(b.columns) == list(b.schema.names)
        for name in b.columns:
            assert a.columns[name].dtype == b.columns[name].dtype, name
            assert a.columns[name].shape == b.columns[name].shape, name
            assert a.columns[name].tobytes() == b.columns[name].tobytes(), name
    assert got[-1].ended and got[-1].columns["image_patches"].shape == (0, 768)
    assert set(imagecolumns.NAMES) <= set(got[0].columns)

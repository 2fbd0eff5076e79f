"""The torch adapter: tensors, labels, cu_seqlens, and a DCP round trip through a sidecar."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from datalane import load_recipe
from datalane.client import Batch, InProcessLoader, SidecarLoader
from datalane.client.torch import DataLaneDataset, cu_seqlens, to_tensors


def test_tensors_shift_labels_and_mask_padding() -> None:
    ids = np.array([[5, 6, 7, 1, 9, 2, 2]], dtype=np.int32)
    pos = np.array([[0, 1, 2, 3, 0, -1, -1]], dtype=np.int32)
    t = to_tensors(Batch(0, 0, ids, pos))
    assert t["input_ids"].tolist() == [[5, 6, 7, 1, 9, 2]]
    assert t["labels"].tolist() == [[6, 7, 1, 9, -100, -100]]
    assert t["positions"].tolist() == [[0, 1, 2, 3, 0, -1]]
    assert t["input_ids"].dtype == torch.int64
    assert t["cu_seqlens"].tolist() == [0, 4, 5, 6]


def test_cu_seqlens_start_every_row() -> None:
    pos = np.array([[3, 4, 0, 1], [5, 0, -1, -1]], dtype=np.int32)
    assert cu_seqlens(pos).tolist() == [0, 2, 4, 5, 6, 8]


def test_dcp_round_trip_through_a_sidecar(sidecar, write_recipe, corpus, tmp_path) -> None:
    recipe_path = write_recipe(sources=[
        {"name": "web", "uris": [corpus.web], "epochs": None, "chunk_rows": 50}])
    sc = sidecar(recipe_path)
    data = DataLaneDataset(SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=4))
    it = iter(data)
    for _ in range(5):
        next(it)
    dcp.save({"data": data}, checkpoint_id=str(tmp_path / "ckpt"))
    expected = [next(it) for _ in range(3)]
    data.loader.close()

    restored = DataLaneDataset(SidecarLoader(sc.socket, rank=1, world_size=2,
                                             microbatch_size=4))
    dcp.load({"data": restored}, checkpoint_id=str(tmp_path / "ckpt"))
    it2 = iter(restored)
    got = [next(it2) for _ in range(3)]
    restored.loader.close()
    for a, b in zip(expected, got, strict=True):
        for key in ("input_ids", "labels", "positions", "cu_seqlens"):
            assert torch.equal(a[key], b[key])

    # the same state restores the in-process mode too: the streams are interchangeable
    local = InProcessLoader(load_recipe(recipe_path), 1, 2, 4)
    DataLaneDataset(local).load_state_dict(restored.state_dict())
    assert local.state_dict()["step"] == restored.loader.state_dict()["step"]


def test_in_process_state_from_another_recipe_names_the_field(make_recipe) -> None:
    import pytest

    from datalane import MismatchError

    a = InProcessLoader(make_recipe(), 0, 1, 4)
    it = iter(a)
    for _ in range(5):
        next(it)
    b = InProcessLoader(make_recipe(seed=11), 0, 1, 4)
    with pytest.raises(MismatchError, match=r"recipe\.seed: saved 5, now 11"):
        b.load_state_dict(a.state_dict())

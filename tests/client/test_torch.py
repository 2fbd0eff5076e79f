"""The torch adapter: tensors, labels, cu_seqlens, and a DCP round trip through a sidecar."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from datalane import load_recipe
from datalane.client import Batch, InProcessLoader, SidecarLoader
from datalane.client.torch import DataLaneDataset, cu_seqlens, to_tensors
from datalane.spec.schema import Column, text_schema


def test_tensors_shift_labels_and_mask_padding() -> None:
    ids = np.array([[5, 6, 7, 1, 9, 2, 2]], dtype=np.int32)
    pos = np.array([[0, 1, 2, 3, 0, -1, -1]], dtype=np.int32)
    t = to_tensors(Batch(0, 0, {"input_ids": ids, "positions": pos}))
    assert t["input_ids"].tolist() == [[5, 6, 7, 1, 9, 2]]
    assert t["labels"].tolist() == [[6, 7, 1, 9, -100, -100]]
    assert t["positions"].tolist() == [[0, 1, 2, 3, 0, -1]]
    assert t["input_ids"].dtype == torch.int64
    assert t["cu_seqlens"].tolist() == [0, 4, 5, 6]


CHAT = text_schema(2, extra=(Column("loss_mask", "uint8", 0, default=1),))


def _chat_batch() -> Batch:
    ids = np.array([[5, 6, 7, 1, 9, 2, 2], [3, 4, 5, 6, 7, 8, 9]], dtype=np.int32)
    pos = np.array([[0, 1, 2, 3, 0, -1, -1], [4, 5, 0, 1, 2, 3, 4]], dtype=np.int32)
    # hand-written, not what a packer makes: 1 on a padding token shows padding wins
    mask = np.array([[0, 0, 1, 1, 1, 1, 0], [1, 1, 0, 0, 1, 1, 1]], dtype=np.uint8)
    return Batch(0, 0, {"input_ids": ids, "positions": pos, "loss_mask": mask}, schema=CHAT)


def test_labels_are_ignored_where_the_target_is_padding_or_masked_off() -> None:
    t = to_tensors(_chat_batch())
    assert list(t) == ["input_ids", "labels", "positions", "loss_mask", "cu_seqlens",
                       "step_tokens"]
    # targets are tokens 1..6; row 0: 6 masked, 7 1 9 trained, 2 2 padding (one with mask 1);
    # row 1: 4 trained, 5 6 masked, 7 8 9 trained
    assert t["labels"].tolist() == [[-100, 7, 1, 9, -100, -100], [4, -100, -100, 7, 8, 9]]
    # the mask comes aligned with the labels (the target tokens), in its own dtype
    assert t["loss_mask"].tolist() == [[0, 1, 1, 1, 1, 0], [1, 0, 0, 1, 1, 1]]
    assert t["loss_mask"].dtype == torch.uint8
    assert t["input_ids"].tolist() == [[5, 6, 7, 1, 9, 2], [3, 4, 5, 6, 7, 8]]
    assert t["positions"].tolist() == [[0, 1, 2, 3, 0, -1], [4, 5, 0, 1, 2, 3]]
    assert t["labels"].dtype == t["positions"].dtype == torch.int64
    assert t["cu_seqlens"].tolist() == [0, 4, 5, 6, 8, 12]


def test_other_columns_come_at_the_input_tokens_and_per_sequence_columns_as_they_are() -> None:
    schema = text_schema(0, extra=(Column("segment", "int32", 0),
                                   Column("doc_count", "int64", 0, per_token=False)))
    ids = np.array([[5, 6, 7]], dtype=np.int32)
    columns = {"input_ids": ids, "positions": np.array([[0, 1, 2]], dtype=np.int32),
               "segment": np.array([[1, 2, 3]], dtype=np.int32),
               "doc_count": np.array([1 << 40], dtype=np.int64)}
    t = to_tensors(Batch(0, 0, columns, schema=schema))
    assert t["segment"].tolist() == [[1, 2]] and t["segment"].dtype == torch.int64
    assert t["doc_count"].tolist() == [1 << 40]
    assert t["labels"].tolist() == [[6, 7]]  # no loss_mask: only padding is ignored


def test_a_batch_keeps_the_text_properties_and_checks_its_schema() -> None:
    b = _chat_batch()
    assert b.input_ids is b.columns["input_ids"] and b.positions is b.columns["positions"]
    assert b.nbytes == 2 * 7 * (4 + 4 + 1)
    c = b.copy()
    assert c.columns["loss_mask"] is not b.columns["loss_mask"] and c.schema is CHAT
    assert all(np.array_equal(c.columns[k], b.columns[k]) for k in b.columns)
    with pytest.raises(ValueError, match=r"columns \['input_ids', 'positions'\] does not match "
                                         r"its schema's \['input_ids', 'positions', 'loss_mask'"):
        Batch(0, 0, {k: b.columns[k] for k in ("input_ids", "positions")}, schema=CHAT)


def test_cu_seqlens_start_every_row() -> None:
    pos = np.array([[3, 4, 0, 1], [5, 0, -1, -1]], dtype=np.int32)
    assert cu_seqlens(pos).tolist() == [0, 2, 4, 5, 6, 8]


@pytest.mark.slow  # a real sidecar process
# DCP saves and loads in this one process on purpose (no process group): torch says it assumes so
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized"
                            ":UserWarning")
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
    from datalane import MismatchError

    a = InProcessLoader(make_recipe(), 0, 1, 4)
    it = iter(a)
    for _ in range(5):
        next(it)
    b = InProcessLoader(make_recipe(seed=11), 0, 1, 4)
    with pytest.raises(MismatchError, match=r"recipe\.seed: saved 5, now 11"):
        b.load_state_dict(a.state_dict())

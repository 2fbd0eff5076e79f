"""Typed columns end to end: a chat recipe (a uint8 loss_mask beside input_ids and positions)
served by a real sidecar, inline and through the shared-memory ring, against in-process.

The sidecar announces the recipe's schema and the slot layout in its reply to Open; the
client reads every column by them. The stream must be the in-process one column for column
(dtype included), and the torch adapter's labels must be -100 exactly where the target is
padding or masked off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from datalane import load_recipe
from datalane.client import Batch, InProcessLoader, SidecarLoader
from datalane.client.torch import DataLaneDataset
from datalane.wire import datalane_pb2 as pb
from datalane.wire import datalane_pb2_grpc as pbg

pytestmark = pytest.mark.slow  # real sidecar processes

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def chat_recipe(corpus: Any, tmp_path: Path) -> str:
    """Conversations (JSONL, system prompts and several turns) mixed with web text."""
    path = tmp_path / "chat.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(80):
            msgs = [{"role": "system", "content": "be brief"}] if i % 3 == 0 else []
            for t in range(1 + i % 3):
                msgs += [{"role": "user", "content": f"question {i} {t} " * (1 + i % 5)},
                         {"role": "assistant", "content": f"answer {i} {t} " * (1 + i % 4)}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    recipe = {"lanes": 4, "global_batch_size": 8, "seq_len": 64, "seed": 3,
              "tokenizer": {"uri": corpus.tokenizer},
              "sources": [{"name": "chat", "uris": [str(path)], "epochs": None,
                           "chunk_bytes": 2048, "chat": {"template_text": CHATML}},
                          {"name": "web", "uris": [corpus.web], "epochs": None,
                           "chunk_rows": 50, "weight": 0.5}]}
    out = tmp_path / "chat-recipe.yaml"
    out.write_text(yaml.safe_dump(recipe))
    return str(out)


def _take(loader: Any, n: int) -> list[Batch]:
    out = []
    for batch in loader:
        out.append(batch.copy())
        if len(out) == n:
            return out
    raise AssertionError("unreachable: the stream is endless")


def test_the_reply_to_open_announces_the_loss_mask_column(sidecar, chat_recipe) -> None:
    sc = sidecar(chat_recipe)
    with grpc.insecure_channel(f"unix://{os.path.abspath(sc.socket)}") as channel:
        reply = pbg.DataLaneStub(channel).Open(pb.OpenRequest(
            protocol_version=2, rank=0, world_size=2, microbatch_size=2, from_start=True,
            transport=pb.TRANSPORT_SHM), timeout=60)
    assert [c["name"] for c in json.loads(reply.schema_json)] == ["input_ids", "positions",
                                                                 "loss_mask"]
    # 2 sequences of 65 tokens: 520 bytes per int32 column, the mask's 130 bytes at 1040,
    # a slot of 1176 bytes (1170 rounded up to 8)
    assert [(f.name, f.dtype, f.offset, f.nbytes, list(f.shape)) for f in reply.layout] == [
        ("input_ids", "int32", 0, 520, [2, 65]), ("positions", "int32", 520, 520, [2, 65]),
        ("loss_mask", "uint8", 1040, 130, [2, 65])]
    assert reply.slot_bytes == 1176


@pytest.mark.parametrize("transport,copy", [("inline", True), ("shm", True), ("shm", False)])
def test_a_chat_stream_through_the_sidecar_is_the_in_process_one(sidecar, chat_recipe,
                                                                transport, copy) -> None:
    sc = sidecar(chat_recipe)
    recipe = load_recipe(chat_recipe)
    with SidecarLoader(sc.socket, rank=1, world_size=2, microbatch_size=2,
                       transport=transport, copy=copy) as loader:
        got = _take(loader, 12)  # 6 steps of 2 microbatches
        assert loader.schema == got[0].schema
    ref = InProcessLoader(recipe, 1, 2, 2)
    want = _take(ref, 12)
    assert got[0].schema == ref.schema
    assert list(ref.schema.names) == ["input_ids", "positions", "loss_mask"]
    for a, b in zip(got, want, strict=True):
        assert (a.step, a.index, a.lane_digests) == (b.step, b.index, b.lane_digests)
        assert list(a.columns) == list(b.columns)
        for name in b.columns:
            assert a.columns[name].dtype == b.columns[name].dtype
            assert np.array_equal(a.columns[name], b.columns[name]), name
    masks = np.concatenate([b.columns["loss_mask"] for b in got])
    positions = np.concatenate([b.positions for b in got])
    assert masks.dtype == np.uint8
    assert (masks[positions < 0] == 0).all()  # padding is never trained on
    assert 0 < masks[positions >= 0].mean() < 1  # chat prompts masked off, answers and web on


def test_torch_labels_over_the_sidecar_follow_the_loss_mask(sidecar, chat_recipe) -> None:
    sc = sidecar(chat_recipe)
    with SidecarLoader(sc.socket, rank=0, world_size=1, microbatch_size=4) as loader:
        items = [item for item, _ in zip(DataLaneDataset(loader), range(6), strict=False)]
    ref = _take(InProcessLoader(load_recipe(chat_recipe), 0, 1, 4), 6)
    masked = 0
    for item, batch in zip(items, ref, strict=True):
        ids, pos, mask = (batch.columns[k] for k in ("input_ids", "positions", "loss_mask"))
        trained = (pos[:, 1:] >= 0) & (mask[:, 1:] == 1)
        assert item["labels"].numpy().tolist() == np.where(trained, ids[:, 1:], -100).tolist()
        assert item["loss_mask"].numpy().tolist() == mask[:, 1:].tolist()
        masked += int(((pos[:, 1:] >= 0) & (mask[:, 1:] == 0)).sum())
    assert masked > 0  # some document tokens are masked off (the prompts)

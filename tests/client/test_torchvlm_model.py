"""TorchTitan's Qwen3.5 vision-language model takes datalane.client.torchvlm's batch: one
forward and backward on CPU of a tiny Qwen3.5 (TorchTitan's own builders, its vision encoder
included) over images of the generated corpus.

What CPU cannot run of TorchTitan 0.3.0's ``qwen3_5`` "debugmodel", and what this test does
instead (docs/vlm.md, "The trainer side"):

* its Gated DeltaNet layers (6 of its 8) call flash-linear-attention's Triton kernels, which
  TorchTitan calls CUDA-only and does not declare (``models/qwen3_5/model.py`` imports ``fla``
  at the top: ``ModuleNotFoundError: No module named 'fla'`` in the venv). The model here has
  full attention in every layer (``full_attention_interval=1``), and where ``fla`` is missing
  an empty stand-in lets the module import; nothing calls it;
* FlexAttention (the vision encoder's always, the decoder's full attention) refuses a backward
  on CPU in torch 2.15 (``NotImplementedError: FlexAttention does not support backward on
  CPU``). The forward runs TorchTitan's FlexAttention (eager: TorchTitan compiles it only for
  speed, about 90 s of inductor on this machine); the backward swaps its kernel for the same
  masked attention computed densely (torch's ``create_mask`` of the very ``BlockMask``), whose
  logits the test first checks equal FlexAttention's;
* a model without a device mesh runs with ``spmd_backend`` "partial_dtensor" (the default,
  "spmd_types", asserts a mesh on ``mrope_positions``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.testing.images import make_image_corpus
from tests.support.vlm import Doc, microbatch, picture

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from datalane.client.torchvlm import to_vlm  # noqa: E402  (needs torch)
from datalane.demos.vlm_model import VOCAB, cpu_attention, tiny_qwen35  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # about 20 s: importing TorchTitan's model, a CPU forward twice
    # the forward runs FlexAttention uncompiled on purpose (compiling it took about 91 s on
    # this machine); torch warns that this materialises the scores, which a tiny model affords
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning"),
]

PAD, VIDEO, START, END, EOS, TPAD = 1024, 1025, 1026, 1027, 1, 1028
SPECIAL = {"image_id": PAD, "video_id": VIDEO, "vision_start_id": START,
           "vision_end_id": END, "pad_id": TPAD}


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    """Row 0: a JPEG's and a PNG's caption documents; row 1: text; padding after both."""
    import pyarrow.parquet as pq

    corpus = make_image_corpus(str(tmp_path_factory.mktemp("vlm-model")), images=4,
                               per_shard=4)
    rows = pq.read_table(Path(corpus.parquet)).to_pylist()
    docs = []
    for key, caption in ((0, [5, 6, 7]), (3, [8, 9])):
        p = picture(rows[key]["image"]).patches
        docs.append(Doc([START, *[PAD] * p.tokens, END, *caption, EOS],
                        [0] * (p.tokens + 2) + [1] * (len(caption) + 1), [(1, p)]))
    seq_len = sum(len(d.ids) for d in docs) + 7
    return to_vlm(microbatch([docs, [Doc([3, 4, 5, EOS], [1] * 4)]], seq_len, TPAD), SPECIAL)


def test_torchtitans_qwen35_runs_forward_and_backward_on_the_batch(
        batch: tuple[dict[str, Any], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, labels = batch
    assert inputs["grid_thw"].shape == (2, 3) and inputs["mrope_positions"] is not None
    model = tiny_qwen35()
    cpu_attention(monkeypatch.setattr, dense=False)  # TorchTitan's kernels, not compiled
    # what TorchTitan's Trainer.post_dataloading_process hands the model
    extra = {k: v for k, v in inputs.items() if k != "input"}
    extra["attention_masks"] = model.get_attention_masks(positions=inputs["positions"])
    with torch.no_grad():
        reference = model(inputs["input"], **extra)
    assert reference.shape == (*inputs["input"].shape, VOCAB)
    assert torch.isfinite(reference).all()

    cpu_attention(monkeypatch.setattr)  # the same attention, computed densely
    logits = model(inputs["input"], **extra)
    assert torch.allclose(logits, reference, atol=1e-4, rtol=1e-4)
    trained = labels != -100
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                             ignore_index=-100, reduction="sum") / trained.sum()
    loss.backward()
    assert math.isfinite(loss.item())
    # the gradient reaches the vision encoder's patch embedding through the scattered runs
    for name in ("vision_encoder.patch_embed.weight", "tok_embeddings.weight",
                 "lm_head.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    # a batch whose placeholders are one short is what the model itself refuses
    short = inputs["input"].clone()
    first = int(np.flatnonzero(short[0].numpy() == PAD)[0])
    short[0, first] = START
    with pytest.raises(ValueError, match="Multimodal misalignment"), torch.no_grad():
        model(short, **extra)

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

import importlib.util
import math
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from datalane.testing.images import make_image_corpus
from tests.support.vlm import Doc, microbatch, picture

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from datalane.client.torchvlm import to_vlm  # noqa: E402  (needs torch)

pytestmark = pytest.mark.slow  # about 20 s: importing TorchTitan's model, a CPU forward twice

PAD, VIDEO, START, END, EOS, TPAD = 1024, 1025, 1026, 1027, 1, 1028
SPECIAL = {"image_id": PAD, "video_id": VIDEO, "vision_start_id": START,
           "vision_end_id": END, "pad_id": TPAD}
VOCAB, DIM = 1152, 64


def _without_fla() -> None:
    """Empty stand-ins for the flash-linear-attention names qwen3_5/model.py imports (its
    Gated DeltaNet kernels), for a model without Gated DeltaNet layers; removed again once the
    model's module is imported."""
    if importlib.util.find_spec("fla") is not None:
        return

    def absent(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("flash-linear-attention is not installed")

    names: dict[str, dict[str, Any]] = {
        "fla.modules.conv.triton.ops": {"CausalConv1dFunction": None},
        "fla.modules.conv.causal_conv1d": {"causal_conv1d": absent},
        "fla.ops.gated_delta_rule": {"chunk_gated_delta_rule": absent,
                                     "fused_recurrent_gated_delta_rule": absent},
        "fla.ops.gated_delta_rule.chunk": {"ChunkGatedDeltaRuleFunction": None},
        "fla.ops.gated_delta_rule.fused_recurrent": {"FusedRecurrentFunction": None}}
    for name, attrs in names.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        for attr, value in attrs.items():  # autograd Functions spmd_types registers
            setattr(sys.modules[name], attr, value if value is not None else
                    type(attr, (torch.autograd.Function,), {}))


def _tiny_qwen35() -> Any:
    """Qwen3.5 from TorchTitan's own config builders (models/qwen3_5/__init__.py), the
    "debugmodel" shrunk: dim 64, 2 decoder layers of full attention (flex), a vision encoder of
    2 layers (patch 16, temporal 2, merge 2: the batch's layout), vocabulary 1,152."""
    before = set(sys.modules)
    _without_fla()
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models import qwen3_5 as q
    from torchtitan.models.common import Embedding, Linear

    for name in set(sys.modules) - before:  # the stand-ins go; the model keeps what it bound
        if name == "fla" or name.startswith("fla."):
            del sys.modules[name]

    set_spmd_backend("partial_dtensor")
    config = q.Qwen35Model.Config(
        vocab_size=VOCAB, dim=DIM, norm=q._offset_norm(DIM),
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM,
                                        param_init=q._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB,
                              param_init=q._output_linear_init(DIM)),
        layers=q._build_qwen35_layers(
            rope=q.MRoPE.Config(dim=16, max_seq_len=4096, theta=10_000_000.0,
                                mrope_section=[3, 3, 2]),
            attn_backend="flex", n_layers=2, dim=DIM, n_heads=2, n_kv_heads=1, head_dim=32,
            rotary_dim=16, hidden_dim=128, n_key_heads=1, n_value_heads=2, key_head_dim=32,
            value_head_dim=32, full_attention_interval=1),
        vision_encoder=q._qwen35_vision_encoder_config(
            dim=DIM, ffn_dim=128, num_layers=2, num_heads=2, patch_size=16,
            temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=DIM,
            num_position_embeddings=1024))
    torch.manual_seed(0)
    with torch.device("meta"):  # as TorchTitan's Trainer builds it
        model = config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    return model.train()


def _dense_flex(q: Any, k: Any, v: Any, *, score_mod: Any, block_mask: Any, scale: Any,
                enable_gqa: bool, return_aux: Any, kernel_options: Any) -> tuple[Any, Any]:
    """FlexAttention's result, computed densely (which CPU can differentiate): the mask is
    torch's ``create_mask`` of the BlockMask's ``mask_mod``; a row with nothing to attend to
    (a padded patch) is 0, as FlexAttention gives it."""
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    assert score_mod is None
    (b, h, length, dim), kv = q.shape, k.shape[2]
    if enable_gqa:
        k = k.repeat_interleave(h // k.shape[1], dim=1)
        v = v.repeat_interleave(h // v.shape[1], dim=1)
    mask = create_mask(block_mask.mask_mod, b, h, length, kv, device=q.device)
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(dim))
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~mask.any(-1, keepdim=True), 0.0), dim=-1)
    out = (weights * mask.any(-1, keepdim=True)) @ v
    return out, AuxOutput(lse=lse if return_aux.lse else None)


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
    model = _tiny_qwen35()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torchtitan.models.common import attention
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.models.qwen3_5 import vision_encoder

    # TorchTitan's kernels, not compiled
    monkeypatch.setattr(FlexAttention, "_compiled_flex_attn", flex_attention)
    monkeypatch.setattr(attention, "_compiled_create_block_mask", create_block_mask)
    monkeypatch.setattr(vision_encoder, "compiled_create_block_mask", create_block_mask)
    # what TorchTitan's Trainer.post_dataloading_process hands the model
    extra = {k: v for k, v in inputs.items() if k != "input"}
    extra["attention_masks"] = model.get_attention_masks(positions=inputs["positions"])
    with torch.no_grad():
        reference = model(inputs["input"], **extra)
    assert reference.shape == (*inputs["input"].shape, VOCAB)
    assert torch.isfinite(reference).all()

    monkeypatch.setattr(FlexAttention, "_compiled_flex_attn", _dense_flex)
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

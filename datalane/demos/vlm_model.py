"""A tiny Qwen3.5 vision-language model that trains on CPU: TorchTitan 0.3.0's own Qwen3.5
config builders, shrunk, with what CPU lacks stood in for.

Used by the VLM demo's ranks (:mod:`datalane.demos.vlm_rank`) and by
tests/client/test_torchvlm_model.py. What CPU cannot run of TorchTitan's ``qwen3_5``
"debugmodel", and what stands in (docs/vlm.md, "The trainer side"):

* its Gated DeltaNet layers call flash-linear-attention's Triton kernels, which TorchTitan calls
  CUDA-only and does not declare (``models/qwen3_5/model.py`` imports ``fla`` at the top). The
  model here has full attention in every layer (``full_attention_interval=1``), and where
  ``fla`` is missing an empty stand-in lets the module import (:func:`without_fla`); nothing
  calls it;
* FlexAttention (the vision encoder's always, the decoder's full attention) refuses a backward
  on CPU in torch 2.15. :func:`dense_flex` computes the same masked attention densely (torch's
  ``create_mask`` of the very ``BlockMask``), which CPU differentiates; :func:`cpu_attention`
  puts it (or eager FlexAttention) in place of TorchTitan's compiled kernels;
* a model without a device mesh runs with ``spmd_backend`` "partial_dtensor" (the default,
  "spmd_types", asserts a mesh on ``mrope_positions``).
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from typing import Any

import torch

__all__ = ["DIM", "VOCAB", "cpu_attention", "dense_flex", "tiny_qwen35", "without_fla"]

VOCAB, DIM = 1152, 64


def without_fla() -> None:
    """Empty stand-ins for the flash-linear-attention names qwen3_5/model.py imports (its
    Gated DeltaNet kernels), for a model without Gated DeltaNet layers; :func:`tiny_qwen35`
    removes them again once the model's module is imported."""
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


def _import_qwen35() -> Any:
    """``torchtitan.models.qwen3_5``, imported with :func:`without_fla`'s stand-ins, which are
    removed again (the model keeps what it bound)."""
    before = set(sys.modules)
    without_fla()
    from torchtitan.models import qwen3_5

    for name in set(sys.modules) - before:
        if name == "fla" or name.startswith("fla."):
            del sys.modules[name]
    return qwen3_5


def tiny_qwen35(seed: int = 0) -> Any:
    """Qwen3.5 from TorchTitan's own config builders (models/qwen3_5/__init__.py), the
    "debugmodel" shrunk: dim 64, 2 decoder layers of full attention (flex), a vision encoder of
    2 layers (patch 16, temporal 2, merge 2: the batch's layout), vocabulary 1,152; 543,040
    parameters, initialised from ``torch.manual_seed(seed)`` (the same on every rank)."""
    q = _import_qwen35()
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.common import Embedding, Linear

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
    torch.manual_seed(seed)
    with torch.device("meta"):  # as TorchTitan's Trainer builds it
        model = config.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    return model.train()


def dense_flex(q: Any, k: Any, v: Any, *, score_mod: Any, block_mask: Any, scale: Any,
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


def cpu_attention(setattr_: Any = setattr, *, dense: bool = True) -> None:
    """TorchTitan's attention kernels uncompiled (inductor took about 90 s for the first
    forward on the 2-core machine): block masks from torch's ``create_block_mask``, and the
    attention :func:`dense_flex` (``dense``, trainable on CPU) or eager FlexAttention.
    ``setattr_`` is ``setattr`` or a pytest ``monkeypatch.setattr``."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    _import_qwen35()
    from torchtitan.models.common import attention
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.models.qwen3_5 import vision_encoder

    setattr_(FlexAttention, "_compiled_flex_attn", dense_flex if dense else flex_attention)
    setattr_(attention, "_compiled_create_block_mask", create_block_mask)
    setattr_(vision_encoder, "compiled_create_block_mask", create_block_mask)

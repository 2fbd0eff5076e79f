"""The tiny causal transformer of the elastic loss-curve experiment (bench/elastic_training.py).

Pre-norm decoder blocks (multi-head causal self-attention through
``scaled_dot_product_attention``, a GELU MLP), learned absolute positions and an output head
tied to the token embedding. No dropout, so a step is a pure function of the weights, the
optimizer state and the batch. Called by bench/elastic_rank.py; the default size (d_model 64,
2 layers, vocabulary 1,024, 256 positions) has 182,016 parameters and takes about 0.3 s a step
of 16 x 256 tokens on 4 gloo ranks sharing two CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ModelConfig", "TinyLM", "global_loss_terms"]


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    seq_len: int
    d_model: int = 64
    layers: int = 2
    heads: int = 4


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyLM(nn.Module):
    """Token ids (batch, seq_len) -> logits (batch, seq_len, vocab)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.ln(x) @ self.tok.weight.T
        return logits


def global_loss_terms(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the token cross-entropies of a microbatch (labels -100 are not counted); the
    caller divides by the global batch's token count, so every world size computes the same
    mean over the same tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100, reduction="sum")

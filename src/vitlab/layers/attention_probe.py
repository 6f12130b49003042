"""Attention pooling from an unprojected learned query (AIMv2's head, `Aimv2AttentionPoolingHead`): a learned query
per head reads every output token once, and a linear map turns the concatenated heads into the pooled vector.
Unlike MAP (layers/attention_pool.py) the query is used as it is (no query projection) and no LayerNorm or MLP
follows. Parameter names follow MAP's (`attn_pool.latent`, `.kv`, `.proj`), so a model has one pooling module
under one name whichever head it uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AttentionProbe(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, kv_bias: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, embed_dim))  # the query, split across the heads
        self.kv = nn.Linear(embed_dim, 2 * embed_dim, bias=kv_bias)  # rows: all keys, then all values
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T, D) -> pooled (B, D). valid (B, T) bool: the tokens the query may read (padding: False)."""
        batch, length, dim = tokens.shape
        q = self.latent.reshape(1, 1, self.num_heads, self.head_dim).transpose(1, 2).expand(batch, -1, -1, -1)
        kv = self.kv(tokens).reshape(batch, length, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)  # each (B, heads, T, head_dim)
        mask = None if valid is None else valid[:, None, None, :]  # (B, 1, 1, T)
        pooled = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, heads, 1, head_dim)
        return self.proj(pooled.transpose(1, 2).reshape(batch, dim))

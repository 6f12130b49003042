"""Multi-head attention pooling (MAP, big_vision's and SigLIP's head; timm's AttentionPoolLatent): a learned probe
token attends to every output token, then a residual MLP refines it. Replaces the class token as the pooled
representation; parameter names follow timm (`attn_pool.latent`, `.q`, `.kv`, `.proj`, `.norm`, `.mlp`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers.mlp import Mlp


class AttentionPool(nn.Module):
    def __init__(
        self, embed_dim: int, num_heads: int, mlp_dim: int, activation: str = "gelu", layer_norm_eps: float = 1e-6
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, embed_dim))  # the probe
        self.q = nn.Linear(embed_dim, embed_dim)
        self.kv = nn.Linear(embed_dim, 2 * embed_dim)  # rows: all keys, then all values
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.norm = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.mlp = Mlp(embed_dim, mlp_dim, activation)

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T, D) -> pooled (B, D). valid (B, T) bool: the tokens the probe may read (padding: False)."""
        batch, length, dim = tokens.shape
        # The probe's query is the same for every image: project it once, then broadcast. (Projecting an expanded
        # view of the parameter also broke torch's FLOP counter, which `vitlab models`/`info` and ablate use.)
        q = self.q(self.latent).reshape(1, 1, self.num_heads, self.head_dim).transpose(1, 2).expand(batch, -1, -1, -1)
        kv = self.kv(tokens).reshape(batch, length, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)  # each (B, heads, T, head_dim)
        mask = None if valid is None else valid[:, None, None, :]  # (B, 1, 1, T)
        pooled = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(batch, 1, dim)
        pooled = self.proj(pooled)
        pooled = pooled + self.mlp(self.norm(pooled))
        return pooled[:, 0]

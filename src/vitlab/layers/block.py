"""One pre-norm Transformer encoder block (paper eqs. 2-3), with optional LayerScale on both branches."""

from __future__ import annotations

import torch
from torch import nn

from vitlab.layers.attention import Attention
from vitlab.layers.drop import DropPath
from vitlab.layers.layer_scale import LayerScale
from vitlab.layers.mlp import Mlp


class Block(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool = True,
                 mlp_activation: str = "gelu", layer_norm_eps: float = 1e-6, dropout: float = 0.0,
                 attention_dropout: float = 0.0, drop_path: float = 0.0, layer_scale: float | None = None,
                 relative_tokens: int = 0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.attn = Attention(embed_dim, num_heads, qkv_bias, attention_dropout, dropout, relative_tokens)
        self.norm2 = nn.LayerNorm(embed_dim, eps=layer_norm_eps)
        self.mlp = Mlp(embed_dim, mlp_dim, mlp_activation, dropout)
        self.drop_path = DropPath(drop_path)
        # The paper's block has none; DINOv2's scales each branch by a learned per-channel gamma.
        self.ls1 = LayerScale(embed_dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.ls2 = LayerScale(embed_dim, layer_scale) if layer_scale is not None else nn.Identity()

    def forward(self, x: torch.Tensor, return_attention: bool = False, queries: int | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (B, T, D); with return_attention also this block's weights (B, heads, T, T). queries: the
        output of the first `queries` tokens only, (B, queries, D), which need every token as keys and values but
        nothing else of the others (the model's last block when its head reads the class token)."""
        if queries is not None:
            x = x[:, :queries] + self.drop_path(self.ls1(self.attn(self.norm1(x), queries=queries)))
            # The MLP on rows (B*Q, D), as in `Attention.forward`: Inductor's int8 linear is wrong on
            # a (B, 1, D) input with a symbolic batch.
            rows = self.mlp(self.norm2(x).reshape(-1, x.shape[-1])).view(x.shape)
            return x + self.drop_path(self.ls2(rows))
        if return_attention:
            attended, weights = self.attn(self.norm1(x), return_weights=True)
        else:
            attended = self.attn(self.norm1(x))
        x = x + self.drop_path(self.ls1(attended))  # z'_l = MSA(LN(z_{l-1})) + z_{l-1}
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))  # z_l = MLP(LN(z'_l)) + z'_l
        return (x, weights) if return_attention else x

"""One pre-norm Transformer encoder block (paper eqs. 2-3), built from the parts it is given: a normalisation
factory (LayerNorm or RMSNorm, layers/norm.py), an MLP factory (the paper's MLP or SwiGLU, layers/mlp.py), an
optional query-key norm, and optional LayerScale on both branches."""

from __future__ import annotations

import functools

import torch
from torch import nn

from vitlab.layers.attention import PLAIN, Attention, AttentionContext
from vitlab.layers.drop import DropPath
from vitlab.layers.layer_scale import LayerScale
from vitlab.layers.mlp import Mlp, MlpFactory
from vitlab.layers.norm import NormFactory

DEFAULT_NORM: NormFactory = functools.partial(nn.LayerNorm, eps=1e-6)  # the official code's and timm's


class Block(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        mlp_dim: int,
        *,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        norm_layer: NormFactory = DEFAULT_NORM,
        mlp_layer: MlpFactory = Mlp,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        drop_path: float = 0.0,
        layer_scale: float | None = None,
        relative_tokens: int = 0,
        key_bias: bool = True,
        proj_bias: bool = True,
    ) -> None:
        """norm_layer: width -> normalisation layer (also the query-key norm's, per head, with qk_norm).
        mlp_layer: (width, hidden width, dropout=) -> MLP. layer_scale: LayerScale's initial value, None for none.
        relative_tokens: the sequence length of relative attention's offset table (0: no relative attention).
        key_bias, proj_bias: the attention's key bias and output projection bias (`Attention`)."""
        super().__init__()
        self.norm1 = norm_layer(embed_dim)
        self.attn = Attention(
            embed_dim,
            num_heads,
            qkv_bias,
            attention_dropout,
            dropout,
            relative_tokens,
            qk_norm_layer=norm_layer if qk_norm else None,
            key_bias=key_bias,
            proj_bias=proj_bias,
        )
        self.norm2 = norm_layer(embed_dim)
        self.mlp = mlp_layer(embed_dim, mlp_dim, dropout=dropout)
        self.drop_path = DropPath(drop_path)
        # The paper's block has none; DINOv2's scales each branch by a learned per-channel gamma.
        self.ls1 = LayerScale(embed_dim, layer_scale) if layer_scale is not None else nn.Identity()
        self.ls2 = LayerScale(embed_dim, layer_scale) if layer_scale is not None else nn.Identity()

    def forward(
        self, x: torch.Tensor, context: AttentionContext = PLAIN, *, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (B, T, D); with return_attention also this block's weights (B, heads, T, T). context:
        what this forward pass tells the attention (rotation, padding mask, kernel)."""
        attended = self.attn(self.norm1(x), **context.kwargs(), return_weights=return_attention)
        attended, weights = attended if return_attention else (attended, None)
        x = x + self.drop_path(self.ls1(attended))  # z'_l = MSA(LN(z_{l-1})) + z_{l-1}
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))  # z_l = MLP(LN(z'_l)) + z'_l
        return (x, weights) if return_attention else x

"""Multi-head self-attention (paper eqs. 5-8 of Appendix A), with a fused query-key-value projection.

The default path calls `scaled_dot_product_attention`, which never materialises the (T x T) weights. When the
caller asks for the weights (analysis), the explicit softmax path computes the same result and hands them back.
`explicit_softmax = True` makes the explicit path the default: under `torch.compile` in bf16 three plain ops let
Inductor fuse the softmax with its neighbours, which for short sequences beats PyTorch's opaque CPU flash kernel
(digits, 17 tokens: 1.6x; MNIST-size, 50 tokens: 1.3x; `python benchmarks/attention_paths.py`). Eager, and
compiled fp32, are as fast or faster with the fused kernel.

With `relative_tokens` (pos_embed "relative") each block also holds learned keys for every 1-D token offset;
the query against them is a logit bias added before the softmax (layers/relative_position.py), passed to the
fused kernel as its additive mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers.relative_position import relative_attention_bias, resample_relative_keys


class Attention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, qkv_bias: bool = True, attention_dropout: float = 0.0,
                 proj_dropout: float = 0.0, relative_tokens: int = 0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_bias)  # rows: all queries, all keys, all values
        self.attn_drop = nn.Dropout(attention_dropout)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_dropout)
        self.explicit_softmax = False  # see the module docstring; `VisionTransformer.set_attention_kernel` sets it
        # Relative attention: a key per offset -(T-1) .. T-1 of a T-token sequence; None without.
        self.rel_pos_keys = nn.Parameter(torch.zeros(2 * relative_tokens - 1, self.head_dim)) if relative_tokens else None
        # Set by the model's dynamic image size mode: stretch the offset table to each input's length on every call.
        self.resample_relative = False

    def forward(self, x: torch.Tensor, return_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (B, T, D); with return_weights also the attention weights (B, heads, T, T)."""
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, head_dim)
        bias = None
        if self.rel_pos_keys is not None:
            keys = resample_relative_keys(self.rel_pos_keys, tokens) if self.resample_relative else self.rel_pos_keys
            bias = relative_attention_bias(q * self.scale, keys)  # (B, heads, T, T)
        if return_weights or self.explicit_softmax:
            logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, T, T)
            weights = (logits if bias is None else logits + bias).softmax(dim=-1)
            out = self.attn_drop(weights) @ v
        else:
            dropout = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
        out = out.transpose(1, 2).reshape(batch, tokens, dim)  # concatenate heads: (B, T, D)
        out = self.proj_drop(self.proj(out))
        return (out, weights) if return_weights else out

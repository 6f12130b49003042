"""Multi-head self-attention (paper eqs. 5-8 of Appendix A), with a fused query-key-value projection.

The default path calls `scaled_dot_product_attention`, which never materialises the (T x T) weights. When the
caller asks for the weights (analysis), the explicit softmax path computes the same result and hands them back.
`explicit_softmax = True` makes the explicit path the default: under `torch.compile` in bf16 three plain ops let
Inductor fuse the softmax with its neighbours, which for short sequences beats PyTorch's opaque CPU flash kernel
(digits, 17 tokens: 1.6x; MNIST-size, 50 tokens: 1.3x; `python benchmarks/attention_paths.py`). Eager, and
compiled fp32, are as fast or faster with the fused kernel, except for training short sequences, where the
explicit path with its own backward (layers/explicit_attention.py) wins (`hardware.TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS`).

With `relative_tokens` (pos_embed "relative") each block also holds learned keys for every 1-D token offset;
the query against them is a logit bias added before the softmax (layers/relative_position.py), passed to the
fused kernel as its additive mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers.explicit_attention import explicit_attention
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

    def forward(self, x: torch.Tensor, return_weights: bool = False, queries: int | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (B, T, D); with return_weights also the attention weights (B, heads, T, T).
        queries: attend from the first `queries` tokens only (every token is still a key and a value) -> (B, queries,
        D), the same rows the full call gives: the last block of a model whose head reads the class token alone.
        The fused projection still runs on every token (slicing its weight instead would save a third of it, but
        PT2E's int8 lowering then computes wrong products, and a dynamically quantized projection has no weight to
        slice); what is saved is the output projection and, in the block, the MLP of the other tokens."""
        batch, tokens, dim = x.shape
        if queries is not None and self.rel_pos_keys is not None:
            raise ValueError("relative attention needs every query's offsets; call it with queries=None")
        if (queries is None and self.explicit_softmax and not return_weights and self.rel_pos_keys is None
                and torch.is_grad_enabled() and not (self.training and self.attn_drop.p > 0)):
            # Training short sequences: the same products with a backward that copies less (explicit_attention.py).
            return self.proj_drop(self.proj(explicit_attention(self.qkv(x), self.num_heads, self.scale)))
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, head_dim)
        if queries is not None:
            q = q[:, :, :queries]  # (B, heads, Q, head_dim)
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
        if queries is None:
            out = out.transpose(1, 2).reshape(batch, tokens, dim)  # concatenate heads: (B, T, D)
            out = self.proj_drop(self.proj(out))
        else:
            # The projection runs on rows (B*Q, D): Inductor's int8 linear (PT2E) computes wrong products on a
            # (B, 1, D) input with a symbolic batch, and rows are the shape every backend handles.
            rows = out.transpose(1, 2).reshape(batch * queries, dim)
            out = self.proj_drop(self.proj(rows)).view(batch, queries, dim)
        return (out, weights) if return_weights else out

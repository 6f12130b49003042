"""Multi-head self-attention (paper eqs. 5-8 of Appendix A), with a fused query-key-value projection.

What changes from one call to the next comes in with the call, as keywords (timm's seam: `rope=`,
`attn_mask=`), never as flags set on the module: the rotation of 2-D rotary positions, a mask of padding tokens,
the kernel, and whether relative attention's offset table is stretched to this input's length.

Kernels. "sdpa" calls `scaled_dot_product_attention`, which never materialises the (T x T) weights. "explicit"
computes softmax(q k^T / sqrt(d)) v as three ops: under `torch.compile` in bf16 they let Inductor fuse the softmax
with its neighbours, which for short sequences beats PyTorch's opaque CPU flash kernel (digits, 17 tokens: 1.6x;
MNIST-size, 50 tokens: 1.3x; `python benchmarks/attention_paths.py`); and training short sequences, where the
explicit path with its own backward (layers/explicit_attention.py) wins (`hardware.TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS`).
Eager, and compiled fp32, are as fast or faster with the fused kernel. A caller that asks for the weights
(analysis) gets the explicit path, whatever the kernel. The explicit path's own backward and the last block's
query trimming are speed paths of the model, not of this layer: models/fast_paths.py.

With `relative_tokens` (pos_embed "relative") each block also holds learned keys for every 1-D token offset;
the query against them is a logit bias added before the softmax (layers/relative_position.py), passed to the
fused kernel as its additive mask. With a query-key norm (`qk_norm_layer`, timm's `q_norm` / `k_norm`) queries
and keys are normalised per head before any rotation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vitlab.layers.norm import NormFactory
from vitlab.layers.relative_position import relative_attention_bias, resample_relative_keys
from vitlab.layers.rotary import RotaryTable

KERNELS = ("sdpa", "explicit")


@dataclass(frozen=True, eq=False)
class AttentionContext:
    """What one forward pass tells every block's attention (the model builds it per call)."""

    rope: RotaryTable | None = None  # 2-D rotary positions: how to turn the patch tokens' queries and keys
    # (B, 1, 1, T) bool: False for padding tokens, which no query reads; or (B, 1, T, T): False where query i may
    # not read key j (EoMT's masked attention: a query reads the patches of its predicted mask)
    attn_mask: torch.Tensor | None = None
    kernel: str = "sdpa"  # "sdpa" or "explicit" (see the module docstring)
    stretch_relative: bool = False  # relative attention: stretch the offset table to this input's length

    def kwargs(self) -> dict:
        """The keywords of `Attention.forward` this context sets."""
        return {
            "rope": self.rope,
            "attn_mask": self.attn_mask,
            "kernel": self.kernel,
            "stretch_relative": self.stretch_relative,
        }


PLAIN = AttentionContext()


class Attention(nn.Module):
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attention_dropout: float = 0.0,
        proj_dropout: float = 0.0,
        relative_tokens: int = 0,
        qk_norm_layer: NormFactory | None = None,
        key_bias: bool = True,
        proj_bias: bool = True,
    ) -> None:
        """qkv_bias: biases of the fused projection; key_bias False (DINOv3) keeps the keys' third of it at zero
        (see `project_qkv`). proj_bias: the output projection's bias."""
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_bias)  # rows: all queries, all keys, all values
        self.key_bias = key_bias or not qkv_bias  # False: the keys' third of the bias is held at zero
        self.zero_key_bias()
        self.q_norm = qk_norm_layer(self.head_dim) if qk_norm_layer is not None else nn.Identity()
        self.k_norm = qk_norm_layer(self.head_dim) if qk_norm_layer is not None else nn.Identity()
        self.attn_drop = nn.Dropout(attention_dropout)
        self.proj = nn.Linear(embed_dim, embed_dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_dropout)
        # Relative attention: a key per offset -(T-1) .. T-1 of a T-token sequence; None without.
        self.rel_pos_keys = (
            nn.Parameter(torch.zeros(2 * relative_tokens - 1, self.head_dim)) if relative_tokens else None
        )

    # q, k and v as three projections by the thirds of the fused weight (`project_apart`), not one projection split
    # by a 5-D permute. Set only on the copy export/openvino.py converts: OpenVINO ran that permute as a memory-bound
    # transpose of its own (49-74 ms of a B/16 batch of 16 on an AMD EPYC, where transformers' three projections
    # need 12-15 ms), while eager PyTorch and PT2E's int8 lowering keep the one larger matrix product.
    separate_projections: bool = False
    # The last block's few queries (a class-token head's) attend through the key and value weights, projecting no
    # key or value at all (`models.fast_paths.attend_first_through_weights`). Set only on the copies the OpenVINO
    # and ONNX exports convert: OpenVINO's int8 B/16 1.02x, ONNX Runtime's int8 MNIST student 1.14x.
    queries_through_weights: bool = False

    @torch.no_grad()
    def zero_key_bias(self) -> None:
        """Set the keys' third of the fused bias to zero (after an initialisation wrote it)."""
        if not self.key_bias:
            dim = self.qkv.out_features // 3
            self.qkv.bias[dim : 2 * dim] = 0

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        """The fused projection x W_qkv + b. A model without a key bias (DINOv3) keeps timm's one `qkv` Linear with
        the keys' third of its bias at zero: where gradients flow, that third is replaced by a constant zero, so no
        optimiser step can move it (and weight decay scales zero to zero); elsewhere the Linear runs as it is, so
        int8 quantization and export see a plain Linear. Nothing is stored for it (no hook, no buffer), so loading
        by assignment and copies keep the rule."""
        # A wrapped projection (peft's LoRA layer) adds its own term to the Linear's, which reading its weight here
        # would skip; its base bias is frozen there, so the zero third cannot move anyway.
        if self.key_bias or not torch.is_grad_enabled() or not isinstance(self.qkv, nn.Linear):
            return self.qkv(x)
        return F.linear(x, self.qkv.weight, self.project_qkv_bias())

    def project_apart(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> x W_q + b_q, x W_k + b_k, x W_v + b_v, each (B, T, D), from the thirds of the fused
        weight and bias (the keys' bias held at zero as `project_qkv` holds it)."""
        weights = self.qkv.weight.chunk(3)
        biases = self.project_qkv_bias().chunk(3) if self.qkv.bias is not None else (None, None, None)
        return tuple(F.linear(x, weight, bias) for weight, bias in zip(weights, biases))  # type: ignore[return-value]

    def project_qkv_bias(self) -> torch.Tensor:
        """The fused bias as the projection uses it: with the keys' third held at zero where gradients flow."""
        bias = self.qkv.bias
        if self.key_bias or not torch.is_grad_enabled():
            return bias
        dim = bias.shape[0] // 3
        return torch.cat([bias[:dim], torch.zeros_like(bias[dim : 2 * dim]), bias[2 * dim :]])

    def split_heads(self, y: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, heads, T, head_dim)."""
        return y.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def queries_keys_values(
        self, x: torch.Tensor, rope: RotaryTable | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> q, k, v, each (B, heads, T, head_dim): the fused projection split into heads, queries and
        keys normalised per head (qk_norm) and then turned (rotary positions)."""
        batch, tokens, _ = x.shape
        if self.separate_projections:
            q, k, v = (self.split_heads(part) for part in self.project_apart(x))
        else:
            qkv = self.project_qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rope.rotate(q), rope.rotate(k)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        kernel: str = "sdpa",
        stretch_relative: bool = False,
        return_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax(q k^T / sqrt(d) + relative bias) v: q (B, heads, Q, head_dim), k and v (B, heads, T, head_dim) ->
        (the heads' outputs (B, heads, Q, head_dim), the weights (B, heads, Q, T) if return_weights, else None).
        attn_mask (B, 1, 1, T) or (B, 1, Q, T) bool: keys a query may read (False: padding, or outside an EoMT
        query's mask). kernel: see the module docstring."""
        bias = None
        if self.rel_pos_keys is not None:
            tokens = k.shape[-2]
            keys = resample_relative_keys(self.rel_pos_keys, tokens) if stretch_relative else self.rel_pos_keys
            bias = relative_attention_bias(q * self.scale, keys)  # (B, heads, T, T)
        if return_weights or kernel == "explicit":
            logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, heads, Q, T)
            if bias is not None:
                logits = logits + bias
            if attn_mask is not None:
                logits = logits.masked_fill(~attn_mask, float("-inf"))
            weights = logits.softmax(dim=-1)
            return self.attn_drop(weights) @ v, (weights if return_weights else None)
        if attn_mask is not None:  # one additive mask: the relative bias, and -inf on padding keys
            bias = attn_mask if bias is None else bias.masked_fill(~attn_mask, float("-inf"))
        dropout = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout), None

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: RotaryTable | None = None,
        attn_mask: torch.Tensor | None = None,
        kernel: str = "sdpa",
        stretch_relative: bool = False,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """MSA(x) = [head_1; ...; head_h] W_o, head_i = softmax(q_i k_i^T / sqrt(d)) v_i (eqs. 5-8):
        x (B, T, D) -> (B, T, D); with return_weights also the attention weights (B, heads, T, T).
        rope: turn the patch tokens' queries and keys (2-D rotary positions). attn_mask (B, 1, 1, T) or (B, 1, T, T)
        bool: keys a query may read (False: padding, or outside an EoMT query's mask). kernel: "sdpa" or "explicit". stretch_relative: relative attention's
        offset table stretched to T (a dynamic image size)."""
        q, k, v = self.queries_keys_values(x, rope)
        heads, weights = self.attend(q, k, v, attn_mask, kernel, stretch_relative, return_weights)
        out = self.proj_drop(self.proj(merge_heads(heads)))  # (B, T, D)
        return (out, weights) if return_weights else out


def merge_heads(heads: torch.Tensor) -> torch.Tensor:
    """The heads' outputs (B, heads, T, head_dim) side by side: (B, T, heads * head_dim)."""
    batch, num_heads, tokens, head_dim = heads.shape
    return heads.transpose(1, 2).reshape(batch, tokens, num_heads * head_dim)

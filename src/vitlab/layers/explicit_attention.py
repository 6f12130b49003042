"""softmax(q k^T / sqrt(d)) v for training short sequences on a CPU, with a hand-written backward that moves less
memory than autograd's.

At 17 tokens (the MNIST recipe's model) attention does little arithmetic, and autograd's version of it spends most
of its time moving memory: the strided q, k and v views are copied for each batched matmul, the heads copied back
together, and the gradients of q, k and v stacked (`cat`) and permuted into the fused projection's layout (copies
and the stack were 60% of its profiled time on a 2-core AMD EPYC). Here the fused projection's output is laid out
head-major once, every product reads and writes contiguous (batch x heads) blocks, the scale rides on the
products, and the three gradients are written into one buffer: four copies in all. Forward and backward of one
block at mnist-28's shape: 1.09x-1.19x autograd's in three runs on that machine, the same values to float
rounding (`python benchmarks/attention_backward.py`).
"""

from __future__ import annotations

import torch


class _ExplicitAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
        batch, tokens, width = qkv.shape
        dim = width // 3
        head_dim = dim // num_heads
        # (B, T, 3, heads, head_dim) -> (3, B * heads, T, head_dim): q, k and v each contiguous per head.
        heads = (
            qkv.view(batch, tokens, 3, num_heads, head_dim)
            .permute(2, 0, 3, 1, 4)
            .reshape(3, batch * num_heads, tokens, head_dim)
        )
        q, k, v = heads[0], heads[1], heads[2]
        logits = torch.baddbmm(
            qkv.new_empty(batch * num_heads, tokens, tokens), q, k.transpose(1, 2), beta=0, alpha=scale
        )  # (B * heads, T, T), the scale folded into the product
        weights = logits.softmax(dim=-1)
        out = torch.bmm(weights, v)  # (B * heads, T, head_dim)
        ctx.save_for_backward(heads, weights)
        ctx.scale = scale
        return out.view(batch, num_heads, tokens, head_dim).transpose(1, 2).reshape(batch, tokens, dim)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        heads, weights = ctx.saved_tensors
        _, batch_heads, tokens, head_dim = heads.shape
        q, k, v = heads[0], heads[1], heads[2]
        batch = grad_out.shape[0]
        num_heads = batch_heads // batch
        grad = (
            grad_out.reshape(batch, tokens, num_heads, head_dim).transpose(1, 2).reshape(batch_heads, tokens, head_dim)
        )
        grads = torch.empty_like(heads)  # dq, dk, dv side by side, as q, k and v came
        torch.bmm(weights.transpose(1, 2), grad, out=grads[2])
        grad_weights = torch.bmm(grad, v.transpose(1, 2))
        grad_logits = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype)
        torch.baddbmm(grads[0], grad_logits, k, beta=0, alpha=ctx.scale, out=grads[0])
        torch.baddbmm(grads[1], grad_logits.transpose(1, 2), q, beta=0, alpha=ctx.scale, out=grads[1])
        grad_qkv = (
            grads.view(3, batch, num_heads, tokens, head_dim)
            .permute(1, 3, 0, 2, 4)
            .reshape(batch, tokens, 3 * num_heads * head_dim)
        )
        return grad_qkv, None, None


def explicit_attention(qkv: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
    """The fused projection's output (B, T, 3D), queries then keys then values, each heads x head_dim -> the
    attended values with the heads concatenated (B, T, D). No mask, no dropout."""
    return _ExplicitAttention.apply(qkv, num_heads, scale)

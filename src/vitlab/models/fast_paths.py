"""The encoder's speed paths, behind one switch: `VisionTransformer.fast_paths` (on by default).

The layers a reader learns from (layers/attention.py, layers/block.py, layers/mlp.py) compute the paper's equations
plainly. This module computes the same equations with less work, for the three places where that was measured to
pay; `model.fast_paths = False` switches all three off. tests/models/test_fast_paths.py holds each to the plain
path: GELU in place bit for bit, the other two to float32 rounding (their matrix products have other shapes, so
other summation orders).

1. **Only the tokens the head reads, in the last block** (`head_tokens`). A head that reads the class token alone
   (the paper's; 2 tokens with DeiT's distillation token) needs nothing else of z_L, so the last block computes
   only those tokens' outputs: the same logits without the last block's output projection and MLP for the other
   tokens (5/8 of a block for mnist-28, 10% of its work; 6% of B/16's), with queries, keys and values still
   projected from every token. (Slicing the fused projection's weight instead would save a third of it, but PT2E's
   int8 lowering then computes wrong products, and a dynamically quantized projection has no weight to slice.)
   The OpenVINO and ONNX exports go further (`Attention.queries_through_weights`, `attend_first_through_weights`): a
   query reads the tokens through the key and value weights, so the last block projects no key or value at all.
2. **GELU in place** (`mlp`). Without autograd and with no hook that could have kept fc1's fresh output, GELU may
   overwrite it: one (B, T, 4D) buffer fewer to allocate and first-touch per block, 6% of B/16 eager CPU
   inference (`python benchmarks/eager_vs_transformers.py`), bit-identical.
3. **Explicit attention with its own backward** (`attend`), when the model's kernel is "explicit" (chosen for
   training short sequences: `hardware.TRAIN_EXPLICIT_ATTENTION_MAX_TOKENS`): a backward that copies less
   (layers/explicit_attention.py; `python benchmarks/attention_backward.py`).

Module hooks and wrappers keep their meaning: a block, attention or MLP that is a subclass or a wrapper, or that a
hook of any kind watches (its own or one on every module), or that was compiled on its own, runs through its own
call, so the hook, checkpointing wrapper or compiled graph sees what it always saw.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_hooks

from vitlab.config import ViTConfig
from vitlab.layers.attention import Attention, AttentionContext, merge_heads
from vitlab.layers.block import Block
from vitlab.layers.explicit_attention import explicit_attention
from vitlab.layers.mlp import Mlp
from vitlab.position_kinds import position_traits


def head_tokens(config: ViTConfig) -> int | None:
    """How many leading tokens of z_L the head of a model of `config` reads when that is all it reads: 1 for the
    paper's class token (2 with DeiT's distillation token, up to the last summary token for C-RADIO), else None (pooling over patches, attention pooling, a
    mix of blocks, relative attention, whose offsets need every query)."""
    if (
        config.classifier != "token"
        or position_traits(config.pos_embed).parameters == "offsets"
        or not config.class_token
    ):
        return None
    if config.summary_tokens:  # C-RADIO's summary reads several class tokens
        return max(config.summary_tokens) + 1
    return 2 if config.distilled else 1


def run_block(block: Block, x: torch.Tensor, context: AttentionContext, queries: int | None = None) -> torch.Tensor:
    """Block.forward's two equations, x (B, T, D) -> (B, T, D), with the speed paths; queries: only the first
    `queries` tokens' outputs, (B, queries, D) (item 1 of the module docstring). A block that is not exactly
    `Block` (a subclass, a checkpointing or FSDP wrapper), or that anything watches (a hook of any kind, a compiled
    call), runs through its own call; so does a last block any part of which is watched, whose hooks would
    otherwise see the trimmed tokens."""
    if not runs_as_written(block, Block):
        return block(x, context)
    if queries is not None and (type(block.attn) is not Attention or any(watched(part) for part in block.modules())):
        return block(x, context)
    if queries is None:
        x = x + block.drop_path(block.ls1(attend(block.attn, block.norm1(x), context)))
        return x + block.drop_path(block.ls2(mlp(block.mlp, block.norm2(x))))
    x = x[:, :queries] + block.drop_path(block.ls1(attend_first(block.attn, block.norm1(x), context, queries)))
    # The MLP on rows (B*Q, D): Inductor's int8 linear (PT2E) computes wrong products on a (B, 1, D) input with a
    # symbolic batch, and rows are the shape every backend handles.
    rows = mlp(block.mlp, block.norm2(x).reshape(-1, x.shape[-1])).view(x.shape)
    return x + block.drop_path(block.ls2(rows))


def attend(attention: Attention, x: torch.Tensor, context: AttentionContext) -> torch.Tensor:
    """MSA(x), (B, T, D) -> (B, T, D): with the explicit kernel's own backward where it applies (item 3)."""
    if not (
        context.kernel == "explicit"
        and torch.is_grad_enabled()
        and context.rope is None
        and context.attn_mask is None
        and attention.rel_pos_keys is None
        and attention.key_bias
        and isinstance(attention.q_norm, nn.Identity)
        and not (attention.training and attention.attn_drop.p > 0)
        and runs_as_written(attention, Attention)
    ):
        return attention(x, **context.kwargs())
    heads = explicit_attention(attention.qkv(x), attention.num_heads, attention.scale)
    return attention.proj_drop(attention.proj(heads))


def attend_first(attention: Attention, x: torch.Tensor, context: AttentionContext, queries: int) -> torch.Tensor:
    """MSA(x) for the first `queries` tokens: x (B, T, D) -> (B, queries, D), the same rows the full call gives;
    every token is still a key and a value."""
    if attention.rel_pos_keys is not None:
        raise ValueError("relative attention needs every query's offsets; call it with queries=None")
    if attention.queries_through_weights and reads_through_weights(attention, context):
        return attend_first_through_weights(attention, x, queries)
    batch, dim = x.shape[0], x.shape[-1]
    q, k, v = attention.queries_keys_values(x, context.rope)
    heads, _ = attention.attend(
        q[:, :, :queries], k, v, context.attn_mask, context.kernel, context.stretch_relative
    )  # (B, heads, Q, head_dim)
    # The projection on rows (B*Q, D), for the reason `run_block` gives.
    rows = merge_heads(heads).reshape(batch * queries, dim)
    return attention.proj_drop(attention.proj(rows)).view(batch, queries, dim)


def reads_through_weights(attention: Attention, context: AttentionContext) -> bool:
    """Whether `attend_first_through_weights` computes what `attention` does in `context`: keys that are a plain
    linear map of the tokens by qkv's weight (no rotation, no per-head norm, no wrapped projection such as a LoRA
    layer, nor a hook on it, which this path would skip), every key readable (no mask), no dropout on the weights."""
    return (
        context.rope is None
        and context.attn_mask is None
        and type(attention.qkv) is nn.Linear
        and not watched(attention.qkv)
        and isinstance(attention.q_norm, nn.Identity)
        and isinstance(attention.k_norm, nn.Identity)
        and not (attention.training and attention.attn_drop.p > 0)
    )


def attend_first_through_weights(attention: Attention, x: torch.Tensor, queries: int) -> torch.Tensor:
    """MSA(x) for the first `queries` tokens, x (B, T, D) -> (B, queries, D), without projecting a key or a value:
    for head h, q_h . (W_k,h x_j + b_k,h) = (W_k,h^T q_h) . x_j + q_h . b_k,h, whose last term is the same for every
    key j, which softmax ignores; and sum_j p_j (W_v,h x_j + b_v,h) = W_v,h (sum_j p_j x_j) + b_v,h, as the weights
    p_j sum to 1. A few queries then cost products of (heads * queries) rows with the T tokens instead of the
    (T x D) @ (D x D) key and value projections: the same values to float rounding (a B/16 class token: 4.8 M
    multiply-adds against 232 M per image). Heads stay in the matmuls' batch dimension, never broadcast over it."""
    batch, _, dim = x.shape
    heads, head_dim = attention.num_heads, attention.head_dim
    rows = batch * queries
    weight_q, weight_k, weight_v = attention.qkv.weight.chunk(3)  # each (D, D), its rows head after head
    bias = attention.qkv.bias
    bias_q, _, bias_v = bias.chunk(3) if bias is not None else (None, None, None)
    q = F.linear(x[:, :queries].reshape(rows, dim), weight_q, bias_q)  # (B*Q, D)
    q = q.view(rows, heads, head_dim).transpose(0, 1)  # (heads, B*Q, head_dim)
    q_keys = torch.bmm(q, weight_k.view(heads, head_dim, dim)) * attention.scale  # (heads, B*Q, D): W_k,h^T q_h
    q_keys = q_keys.view(heads, batch, queries, dim).transpose(0, 1).reshape(batch, heads * queries, dim)
    weights = torch.bmm(q_keys, x.transpose(1, 2)).softmax(dim=-1)  # (B, heads*Q, T)
    mixed = torch.bmm(weights, x)  # (B, heads*Q, D): sum_j p_j x_j
    mixed = mixed.view(batch, heads, queries, dim).transpose(0, 1).reshape(heads, rows, dim)
    values = torch.bmm(mixed, weight_v.view(heads, head_dim, dim).transpose(1, 2))  # (heads, B*Q, head_dim)
    if bias_v is not None:
        values = values + bias_v.view(heads, 1, head_dim)
    merged = values.view(heads, batch, queries, head_dim).permute(1, 2, 0, 3).reshape(rows, dim)  # merge_heads
    return attention.proj_drop(attention.proj(merged)).view(batch, queries, dim)


def mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """MLP(x), with GELU written over fc1's output where nothing else can see it (item 2)."""
    if not (runs_as_written(module, Mlp) and isinstance(module.act, nn.GELU) and fc1_output_is_private(module)):
        return module(x)
    hidden = torch.ops.aten.gelu_(module.fc1(x), approximate=module.act.approximate)
    return module.drop2(module.fc2(module.drop1(hidden)))


def fc1_output_is_private(module: Mlp) -> bool:
    """True when nothing but this forward pass can see fc1's output, so it may be overwritten: autograd is off (it
    would keep the tensor for the backward pass), and no forward hook on the MLP, fc1, the activation or every
    module could have kept it or expects to be called."""
    if torch.is_grad_enabled():
        return False
    return not (watched(module) or watched(module.fc1) or watched(module.act))


def runs_as_written(module: nn.Module, kind: type[nn.Module]) -> bool:
    """Whether `module` is exactly `kind` (not a subclass with a forward of its own, nor a wrapper) and nothing
    watches its call: only then may its equations be computed here instead of by its `forward`."""
    return type(module) is kind and not watched(module)


def watched(module: nn.Module) -> bool:
    """Whether anything hangs on `module`'s call: a forward, forward-pre, backward or backward-pre hook of its own
    or registered for every module, or a compiled call (`module.compile()`)."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or getattr(module, "_compiled_call_impl", None) is not None
        or module_hooks._global_forward_hooks
        or module_hooks._global_forward_pre_hooks
        or module_hooks._global_backward_hooks
        or module_hooks._global_backward_pre_hooks
    )

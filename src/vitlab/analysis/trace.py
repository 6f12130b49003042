"""`vitlab info MODEL --trace`: one image walked through a ViT, step by step, with the paper's equation, the
tensor's shape and the parameters of each step; for a checkpoint, statistics of the real activations.

    x_p^i (N patches of P x P x C, flattened)  ->  x_p^i E  ->  [x_class; ...] + E_pos = z_0          (eq. 1)
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                                                                (eq. 2)
    z_l  = MLP(LN(z'_l)) + z'_l                                                                      (eq. 3)
    y = LN(z_L^0)  ->  head                                                                          (eq. 4)

The walk computes every step with the model's own modules, in the order its forward pass does, so its last
tensor is the model's output (tests/analysis/test_trace.py checks it equals `model(image)`). Every block is traced step by
step; the printout shows the first block's steps and one line for each later block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitlab.data.datasets import load_dataset
from vitlab.data.preprocess import prepare
from vitlab.layers.patch_embed import patchify
from vitlab.models.vit import add_positions
from vitlab.position_kinds import position_traits


@dataclass
class Step:
    name: str  # what happens, e.g. "LN (norm1)"
    equation: str  # the paper's symbol or equation it computes
    tensor: torch.Tensor  # the result, batch of one
    params: int = 0  # parameters this step uses
    block: int | None = None  # the encoder block it belongs to (None: outside the blocks)
    notes: list[str] = field(default_factory=list)

    def statistics(self) -> dict[str, float]:
        values = self.tensor.float()
        return {
            "mean": values.mean().item(),
            "std": values.std().item() if values.numel() > 1 else 0.0,
            "min": values.min().item(),
            "max": values.max().item(),
        }


def count(*modules: Any) -> int:
    total = 0
    for module in modules:
        if isinstance(module, nn.Module):
            total += sum(p.numel() for p in module.parameters())
        elif isinstance(module, torch.Tensor):
            total += module.numel()
    return total


NORM_NAMES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


@torch.no_grad()
def trace(model: nn.Module, image: torch.Tensor) -> list[Step]:
    """The steps of `model` (a VisionTransformer in eval mode) on one image (1, C, H, W), normalised."""
    config = model.config
    steps = [Step("input image", "x", image)]
    norm_name = NORM_NAMES[config.norm]
    prefix = config.num_prefix_tokens
    embed = model.patch_embed
    if embed.backbone is not None:
        features = embed.backbone(image)
        steps.append(Step("ResNet stem (the hybrid's feature map)", "CNN(x)", features, count(embed.backbone)))
        source = features
    else:
        source = image
    patches = patchify(source, config.patch_size)
    ph, pw = config.patch_size
    steps.append(
        Step(f"cut into {patches.shape[1]} patches of {ph}x{pw}x{source.shape[1]}, each flattened", "x_p^i", patches)
    )
    projected = embed(image)  # (1, N, D), as the model's forward embeds them
    steps.append(Step("linear projection of every patch", "x_p^i E", projected, count(embed.proj, embed.norm)))
    if config.patch_norm:
        steps[-1].notes.append(f"then a {norm_name} of every projected patch (AIMv2's patch_embed.norm)")
    prefix_tokens = [t.expand(1, -1, -1) for t in (model.cls_token, model.dist_token, model.reg_token) if t is not None]
    tokens = torch.cat(prefix_tokens + [projected], dim=1)
    names = [
        name
        for name, token in (
            ("class", model.cls_token),
            ("distillation", model.dist_token),
            ("register", model.reg_token),
        )
        if token is not None
    ]
    if names:
        plural = "s" if len(names) > 1 or config.register_tokens > 1 else ""
        steps.append(
            Step(
                f"prepend the {', '.join(names)} token{plural}",
                "[x_class; x_p^1 E; ...; x_p^N E]",
                tokens,
                count(model.cls_token, model.dist_token, model.reg_token),
            )
        )
    z0, layout = model.prepare_tokens(image)
    context = model.block_context(layout, 1)
    later_positions = context.tables
    position_params = count(model.pos_embed, model.pos_embed_row, model.pos_embed_col)
    positions = position_traits(config.pos_embed)
    if positions.table and later_positions is None:
        steps.append(
            Step(f"add the position embedding: {positions.summary}", "z_0 = ... + E_pos   (eq. 1)", z0, position_params)
        )
    else:
        where = "; added before every block" if positions.table else ""
        steps.append(Step(f"z_0 (positions: {positions.summary}{where})", "z_0   (eq. 1)", z0, position_params))
    if config.pre_norm:
        steps[-1].notes.append("CLIP's pre-encoder LayerNorm (norm_pre) is applied here")
    x = z0
    states = []  # every block's output, which layer-weighted pooling mixes
    for index, block in enumerate(model.blocks):
        if later_positions is not None:
            x = add_positions(x, later_positions[index if len(later_positions) > 1 else 0], config)
            steps.append(Step("add the position table", "z + E_pos^l", x, block=index))
        normed = block.norm1(x)
        steps.append(Step(norm_name, "LN(z_{l-1})", normed, count(block.norm1), index))
        rope = context.attention.rope
        if rope is not None and index == 0:  # the same turn in every block; shown once, on the queries
            queries = block.attn.qkv(normed)[..., : config.embed_dim]
            queries = block.attn.q_norm(queries.reshape(*queries.shape[:2], config.num_heads, config.head_dim))
            turned = rope.rotate(queries.transpose(1, 2)).transpose(1, 2).flatten(2)
            steps.append(
                Step(
                    f"2-D rotary positions: turn the patch tokens' queries and keys (theta {config.rope_theta:g}; "
                    f"the {prefix} prefix token{'s' if prefix != 1 else ''} unturned)",
                    "q' = q cos(a) + rotate_half(q) sin(a),  a(r, c) = 2 pi [y f; x f; y f; x f],  "
                    "f_i = theta^(-4i/d_head),  (y, x) = patch centre in [-1, 1]",
                    turned,
                    0,
                    index,
                )
            )
        attended = block.ls1(block.attn(normed, **context.attention.kwargs()))
        steps.append(
            Step(
                f"multi-head self-attention ({config.num_heads} heads)",
                "MSA(LN(z_{l-1}))",
                attended,
                count(block.attn, block.ls1),
                index,
            )
        )
        if not isinstance(block.ls1, nn.Identity) and index == 0:
            steps[-1].notes.append("scaled per channel by LayerScale's learned gamma (ls1; the MLP's by ls2)")
        x = x + attended
        steps.append(Step("residual", "z'_l = MSA(LN(z_{l-1})) + z_{l-1}   (eq. 2)", x, 0, index))
        normed = block.norm2(x)
        steps.append(Step(norm_name, "LN(z'_l)", normed, count(block.norm2), index))
        transformed = block.ls2(block.mlp(normed))
        steps.append(
            Step(
                f"MLP ({config.embed_dim} -> {config.mlp_dim} -> {config.embed_dim}, "
                f"{config.mlp_activation if config.mlp == 'mlp' else config.mlp})",
                "MLP(LN(z'_l))",
                transformed,
                count(block.mlp, block.ls2),
                index,
            )
        )
        x = x + transformed
        steps.append(Step("residual", "z_l = MLP(LN(z'_l)) + z'_l   (eq. 3)", x, 0, index))
        states.append(x)
    encoded = model.norm(x)
    if not isinstance(model.norm, nn.Identity):
        steps.append(Step(f"final {norm_name}", "LN(z_L)", encoded, count(model.norm)))
    mixed = states if config.classifier == "layer_weighted" else None
    head_features = model.forward_head(encoded, pre_logits=True, hidden_states=mixed)
    pooling = {
        "token": "the class token",
        "gap": "the mean of the patch tokens",
        "map": "attention pooling (MAP)",
        "probe": "attention pooling from a learned query (AIMv2)",
        "gem": "GeM pooling",
        "max": "max pooling",
    }.get(config.classifier, config.classifier)
    if config.distilled and config.distillation_head:
        pooling = "the class and distillation tokens"
    steps.append(
        Step(
            f"pool: {pooling}" + (", then the pre-logits layer (Linear + tanh)" if config.representation_size else ""),
            "y = LN(z_L^0)   (eq. 4)",
            head_features,
            count(model.fc_norm, model.attn_pool, model.gem_pool, model.layer_weights, model.pre_logits),
        )
    )
    output = model.forward_head(encoded, hidden_states=mixed)
    if config.num_classes:
        name = "CLIP's projection into the joint space" if config.projection else f"head: {config.num_classes} logits"
        steps.append(Step(name, "y W_head", output, count(model.head, model.head_dist)))
    if prefix == 0 and config.classifier == "token":
        steps[-1].notes.append("no prefix token")
    return steps


def format_trace(steps: list[Step], title: str, statistics: bool) -> str:
    """The walk as text: every step outside the blocks and of the first block, one line per later block."""
    lines = [title]
    header = f"  {'step':<58} {'shape':<18} {'params':>10}" + (
        "   mean     std      min      max" if statistics else ""
    )
    lines += [header, "  " + "-" * (len(header) - 2)]  # the rule runs under every column

    def row(label: str, step: Step, params: int) -> str:
        text = f"  {label:<58} {str(tuple(step.tensor.shape)):<18} {params:>10,}"
        if statistics:
            stats = step.statistics()
            text += "".join(f" {stats[key]:>8.3f}" for key in ("mean", "std", "min", "max"))
        return text

    blocks = max((s.block for s in steps if s.block is not None), default=-1) + 1
    words = {6: "six", 7: "seven", 8: "eight"}
    first_block = sum(s.block == 0 for s in steps)
    first_block = words.get(first_block, str(first_block))
    for step in steps:
        if step.block is None:
            lines.append(row(step.name, step, step.params))
            lines.append(f"  {'':<4}{step.equation}")
            lines += [f"  {'':<4}note: {note}" for note in step.notes]
        elif step.block == 0:
            lines.append(row(f"block 1: {step.name}", step, step.params))
            lines.append(f"  {'':<4}{step.equation}")
            lines += [f"  {'':<4}note: {note}" for note in step.notes]
        elif step.equation.startswith("z_l = "):  # one line per later block: its output z_l
            params = sum(s.params for s in steps if s.block == step.block)
            lines.append(
                row(
                    f"block {step.block + 1} of {blocks}: the same {first_block} steps -> z_{step.block + 1}",
                    step,
                    params,
                )
            )
    total = sum(s.params for s in steps)
    lines.append(f"  parameters used on the way: {total:,}")
    return "\n".join(lines)


def example_image(config, seed: int = 0) -> tuple[torch.Tensor, str]:
    """A shipped digit (the digits test split's first image) at the model's size and channels, normalised; what a
    student can look at without any file."""
    digits = load_dataset("digits", "test")
    return prepare(digits.images[:1], digits.max_value, config), "the first digits test image"

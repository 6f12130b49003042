"""Parameter and FLOP counts of a model config by formula, without building the model or importing torch.

`vitlab models` prints a table of every variant; counting by tracing each model (`models.registry.model_stats`,
which counts any config exactly) costs 3 s plus torch's import, the formula microseconds. FLOPs count a
multiply-add as 2 and cover what `torch.utils.flop_counter` counts: matrix products and convolutions (norms,
softmax and activations are left out, as in the reference figures: 35.13 GFLOPs for B/16 at 224).
tests/test_counts.py holds the formula to the traced count for every variant and several sizes.
"""

from __future__ import annotations

import math

from vitlab.config import ViTConfig
from vitlab.models.positions.kinds import position_traits


def formula_covers(config: ViTConfig) -> bool:
    """The formula knows the paper's models (token or GAP pooling, representation layer, hybrid stem) and the
    2025 backbones' parts (register tokens, LayerScale, rotary positions, RMSNorm, SwiGLU, the biases each on its
    own, the patch norm, MAP and AIMv2's probe heads); the rest (distillation, CLIP's pre-norm and projection,
    query-key norm, relative and 2-D learned positions, every-block tables, GeM, max and layer-weighted pooling)
    is left to the exact count, as are the dense heads (EoMT, DPT, the segmentation heads)."""
    return (
        config.dense_head == "none"
        and config.classifier in ("token", "gap", "map", "probe")
        and position_traits(config.pos_embed).parameters in ("table", None)  # a table of a row per token, or none
        and config.pos_embed_placement == "input"
        and not config.distilled
        and not config.pre_norm
        and not config.projection
        and not config.qk_norm
        and not config.fc_norm
        and config.final_norm
        and config.pool_mlp_dim is None
    )


def resnet_stem_counts(config: ViTConfig) -> tuple[int, int, int]:
    """(parameters, FLOPs, output channels) of the hybrid's ResNet stem (models/hybrid.py): "SAME" padding, so
    every stride-2 layer gives ceil(size / 2)."""
    height, width = config.image_size
    params = flops = 0

    def conv(in_chans: int, out_chans: int, kernel: int, stride: int) -> None:
        nonlocal params, flops, height, width
        height, width = math.ceil(height / stride), math.ceil(width / stride)
        params += in_chans * out_chans * kernel * kernel
        flops += 2 * in_chans * out_chans * kernel * kernel * height * width

    def group_norm(channels: int) -> None:
        nonlocal params
        params += 2 * channels

    base = int(64 * config.resnet_width_factor)
    conv(config.in_chans, base, 7, 2)
    group_norm(base)
    height, width = math.ceil(height / 2), math.ceil(width / 2)  # the 3x3/2 max-pool
    channels = base
    for index, units in enumerate(config.resnet_layers or ()):
        stage_width = base * 2**index
        for unit in range(units):
            stride = 2 if index > 0 and unit == 0 else 1
            out_chans = 4 * stage_width
            if channels != out_chans or stride != 1:  # the projection shortcut, at the unit's output size
                saved = height, width
                conv(channels, out_chans, 1, stride)
                group_norm(out_chans)
                height, width = saved
            conv(channels, stage_width, 1, 1)
            group_norm(stage_width)
            conv(stage_width, stage_width, 3, stride)
            group_norm(stage_width)
            conv(stage_width, out_chans, 1, 1)
            group_norm(out_chans)
            channels = out_chans
    return params, flops, channels


def model_size(config: ViTConfig) -> tuple[int, float]:
    """(parameter count, GFLOPs per image) of any config: by formula where it covers the config, else by tracing
    the model (`models.registry.model_stats`, which imports torch)."""
    if formula_covers(config):
        return parameters_and_flops(config)
    from vitlab.models.registry import model_stats

    return model_stats(config)


def parameters_and_flops(config: ViTConfig) -> tuple[int, float]:
    """(parameter count, GFLOPs of one image's forward pass) of a config `formula_covers`."""
    if not formula_covers(config):
        raise ValueError(
            f"the formula does not cover this config ({config.classifier} pooling or another family's "
            "extras); use vitlab.models.model_stats"
        )
    dim, mlp, patch_h, patch_w = config.embed_dim, config.mlp_dim, *config.patch_size
    params, flops, in_chans = 0, 0, config.in_chans
    if config.resnet_layers is not None:
        params, flops, in_chans = resnet_stem_counts(config)
    patches, tokens = config.num_patches, config.num_tokens
    norm = dim if config.norm == "rmsnorm" else 2 * dim  # RMSNorm has a scale only
    # Eq. 1: the patch projection (a convolution with stride P, i.e. one matrix product per patch), tokens.
    params += in_chans * patch_h * patch_w * dim + dim + (norm if config.patch_norm else 0)
    flops += 2 * in_chans * patch_h * patch_w * dim * patches
    params += config.num_prefix_tokens * dim
    if position_traits(config.pos_embed).parameters == "table":  # rotary positions and "none" have no table
        params += (config.num_position_prefix + patches) * dim
    # Eqs. 2-3, per block: two norms, qkv and output projections, the MLP (two matrices, or SwiGLU's three);
    # attention's two products (Q K^T and A V) cost 2 * tokens^2 * dim each.
    mlp_matrices = 3 if config.mlp == "swiglu" else 2
    block_params = 2 * norm + 3 * dim * dim + (3 * dim if config.qkv_bias else 0) + dim * dim
    block_params += dim if config.proj_bias else 0
    block_params += mlp_matrices * dim * mlp + ((mlp_matrices - 1) * mlp + dim if config.mlp_bias else 0)
    block_params += 2 * dim if config.layer_scale is not None else 0
    block_flops = 2 * tokens * (3 * dim * dim + dim * dim + mlp_matrices * dim * mlp) + 4 * tokens * tokens * dim
    params += config.depth * block_params + norm  # and the final norm
    flops += config.depth * block_flops
    if config.classifier == "map":  # a probe's projected query, keys and values of every token, one MLP
        params += dim + 4 * dim * dim + 4 * dim + 2 * dim + 2 * dim * mlp + mlp + dim
        flops += 2 * dim * dim + 2 * tokens * dim * 2 * dim + 4 * tokens * dim + 2 * dim * dim + 4 * dim * mlp
    elif config.classifier == "probe":  # AIMv2: an unprojected query, keys and values, the output map
        params += dim + 2 * dim * dim + (2 * dim if config.qkv_bias else 0) + dim * dim + dim
        flops += 2 * tokens * dim * 2 * dim + 4 * tokens * dim + 2 * dim * dim
    head_in = dim
    if config.representation_size:
        params += dim * config.representation_size + config.representation_size
        flops += 2 * dim * config.representation_size
        head_in = config.representation_size
    if config.num_classes:
        params += head_in * config.num_classes + config.num_classes
        flops += 2 * head_in * config.num_classes
    return params, flops / 1e9

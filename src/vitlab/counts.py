"""Parameter and FLOP counts of a model config by formula, without building the model or importing torch.

`vitlab models` prints a table of every variant; counting by tracing each model (`models.registry.model_stats`,
which counts any config exactly) costs 3 s plus torch's import, the formula microseconds. FLOPs count a
multiply-add as 2 and cover what `torch.utils.flop_counter` counts: matrix products, attention and convolutions
(norms, softmax, activations and resizes are left out, as in the reference figures: 35.13 GFLOPs for B/16 at 224).
A model with a dense head (EoMT, Depth Anything, the segmentation heads) is counted as its `forward` runs.
tests/test_counts.py holds the formula to the traced count for every variant and several sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vitlab.config import ViTConfig
from vitlab.head_configs import DPTConfig, EoMTConfig, UpsamplingSegmentationConfig, head_settings
from vitlab.position_kinds import position_traits


def formula_covers(config: ViTConfig) -> bool:
    """The formula knows the paper's models (token or GAP pooling, representation layer, hybrid stem) and the
    2025 backbones' parts (register tokens, LayerScale, rotary positions, RMSNorm, SwiGLU, the biases each on its
    own, the patch norm, MAP and AIMv2's probe heads); the rest (distillation, CLIP's pre-norm and projection,
    query-key norm, relative and 2-D learned positions, every-block tables, GeM, max and layer-weighted pooling)
    is left to the exact count. The encoders it covers may carry any head kind of `HEAD_COUNTS`: the classifier,
    or a dense head (EoMT, Depth Anything's DPT, the linear and upsampling segmentation heads)."""
    return (
        config.dense_head in HEAD_COUNTS
        and config.classifier in ("token", "gap", "map", "probe")
        and position_traits(config.pos_embed).parameters in ("table", None)  # a table of a row per token, or none
        and config.pos_embed_placement == "input"
        and not config.distilled
        and not config.pre_norm
        and not config.projection
        and not config.qk_norm
        and not config.fc_norm
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
    """(parameter count, GFLOPs of one image's forward pass) of a config `formula_covers`: the encoder's
    parameters and patch embedding, then what the head kind (`HEAD_COUNTS`) runs on top of them."""
    if not formula_covers(config):
        raise ValueError(
            f"the formula does not cover this config ({config.classifier} pooling or another family's "
            "extras); use vitlab.models.model_stats"
        )
    params, flops = encoder_counts(config)
    head_params, head_flops = HEAD_COUNTS[config.dense_head](config)
    return params + head_params, (flops + head_flops) / 1e9


def layer_norm_params(config: ViTConfig) -> int:
    """Parameters of one of the encoder's norms: RMSNorm has a scale only, LayerNorm a scale and a bias."""
    return config.embed_dim if config.norm == "rmsnorm" else 2 * config.embed_dim


def encoder_counts(config: ViTConfig) -> tuple[int, int]:
    """(parameters of the whole encoder: stem, patch embedding, prefix tokens, position table, every block and the
    final norm; FLOPs of the stem and the patch embedding). The blocks' FLOPs are the head kind's to count, as it
    decides how many blocks run and on how many tokens (`block_flops`)."""
    dim, mlp, patch_h, patch_w = config.embed_dim, config.mlp_dim, *config.patch_size
    params, flops, in_chans = 0, 0, config.in_chans
    if config.resnet_layers is not None:
        params, flops, in_chans = resnet_stem_counts(config)
    norm = layer_norm_params(config)
    # Eq. 1: the patch projection (a convolution with stride P, i.e. one matrix product per patch), tokens.
    params += in_chans * patch_h * patch_w * dim + dim + (norm if config.patch_norm else 0)
    flops += 2 * in_chans * patch_h * patch_w * dim * config.num_patches
    params += config.num_prefix_tokens * dim
    if config.pos_embed == "cpe":  # C-RADIO's square table for its largest image (models/positions/cropped.py)
        params += (int(config.cpe_max_size or 0) // patch_h) ** 2 * dim
    elif position_traits(config.pos_embed).parameters == "table":  # rotary positions and "none" have no table
        params += (config.num_position_prefix + config.num_patches) * dim
    # Eqs. 2-3, per block: two norms, qkv and output projections, the MLP (two matrices, or SwiGLU's three).
    mlp_matrices = 3 if config.mlp == "swiglu" else 2
    block_params = 2 * norm + 3 * dim * dim + (3 * dim if config.qkv_bias else 0) + dim * dim
    block_params += dim if config.proj_bias else 0
    block_params += mlp_matrices * dim * mlp + ((mlp_matrices - 1) * mlp + dim if config.mlp_bias else 0)
    block_params += 2 * dim if config.layer_scale is not None else 0
    params += config.depth * block_params + (norm if config.final_norm else 0)  # and the final norm
    # The image-level pooling a config asks for (MAP, AIMv2's probe, the representation layer) is built by every
    # model, dense ones included, though only the classifier runs it.
    params += pooling_counts(config)[0]
    return params, flops


def block_flops(config: ViTConfig, tokens: int) -> int:
    """FLOPs of one block on `tokens` tokens: the qkv and output projections and the MLP per token, and attention's
    two products (Q K^T and A V), 2 * tokens^2 * dim each."""
    dim, mlp_matrices = config.embed_dim, 3 if config.mlp == "swiglu" else 2
    return 2 * tokens * (4 * dim * dim + mlp_matrices * dim * config.mlp_dim) + 4 * tokens * tokens * dim


def pooling_counts(config: ViTConfig) -> tuple[int, int]:
    """(parameters, FLOPs) of the pooling between the final norm and the classifier: MAP's or AIMv2's attention
    pool and the representation layer (token and GAP pooling have none)."""
    dim, mlp, tokens = config.embed_dim, config.mlp_dim, config.num_tokens
    params = flops = 0
    if config.classifier == "map":  # a probe's projected query, keys and values of every token, one MLP
        params += dim + 4 * dim * dim + 4 * dim + 2 * dim + 2 * dim * mlp + mlp + dim
        flops += 2 * dim * dim + 2 * tokens * dim * 2 * dim + 4 * tokens * dim + 2 * dim * dim + 4 * dim * mlp
    elif config.classifier == "probe":  # AIMv2: an unprojected query, keys and values, the output map
        params += dim + 2 * dim * dim + (2 * dim if config.qkv_bias else 0) + dim * dim + dim
        flops += 2 * tokens * dim * 2 * dim + 4 * tokens * dim + 2 * dim * dim
    if config.representation_size:
        params += dim * config.representation_size + config.representation_size
        flops += 2 * dim * config.representation_size
    return params, flops


# ------------------------------------------------------------------------------------------------- the heads
# Each head kind's (parameters, FLOPs) beyond `encoder_counts`: its blocks' FLOPs and its own parts. The dense
# heads' FLOPs are what `torch.utils.flop_counter` counts on them: matrix products (the einsum of EoMT's masks among
# them), attention, and convolutions, transposed and grouped ones included (2 x the weight's elements x the output's
# pixels, a transposed one's input pixels); bilinear resizes, norms, activations and the residual adds are not
# counted. A convolution's bias is a parameter but no counted FLOP, as for a linear layer.


def classifier_counts(config: ViTConfig) -> tuple[int, int]:
    """No head part (a classifier or a bare encoder): every block on every token, the pooling and the classifier (models/vit.py)."""
    flops = config.depth * block_flops(config, config.num_tokens) + pooling_counts(config)[1]
    head_in = config.representation_size or config.pooled_dim  # C-RADIO's summary: D per summary token
    if not config.num_classes:
        return 0, flops
    return head_in * config.num_classes + config.num_classes, flops + 2 * head_in * config.num_classes


def conv_counts(in_chans: int, out_chans: int, kernel: int, pixels: int, bias: bool = True) -> tuple[int, int]:
    """(parameters, FLOPs) of a kernel x kernel convolution with `pixels` output pixels (a transposed one: input)."""
    weights = in_chans * out_chans * kernel * kernel
    return weights + (out_chans if bias else 0), 2 * weights * pixels


def eomt_counts(config: ViTConfig) -> tuple[int, int]:
    """EoMT (models/eomt.py): no image classifier; the queries, their class head (num_classes + 1 outputs) and
    3-layer mask MLP, the x2 upscaling blocks (layers/upscale.py), and the head's last `blocks` blocks on its
    `queries` more tokens."""
    eomt = head_settings(config, EoMTConfig)
    dim, queries, classes = config.embed_dim, eomt.queries, config.num_classes + 1
    plain_blocks = config.depth - eomt.blocks
    flops = plain_blocks * block_flops(config, config.num_tokens)
    flops += eomt.blocks * block_flops(config, queries + config.num_tokens)
    params = queries * dim + dim * classes + classes + 3 * (dim * dim + dim)
    flops += 2 * queries * dim * classes + 3 * 2 * queries * dim * dim
    rows, cols = config.grid_size
    for _ in range(eomt.upscale_blocks):
        transposed = conv_counts(dim, dim, 2, rows * cols)  # k = s = 2: counted on its input's pixels
        rows, cols = 2 * rows, 2 * cols
        depthwise = conv_counts(1, dim, 3, rows * cols, bias=False)  # groups = channels: one input channel each
        params += transposed[0] + depthwise[0] + 2 * dim  # and LayerNorm2d's scale and bias, whatever config.norm
        flops += transposed[1] + depthwise[1]
    return params, flops + 2 * queries * dim * rows * cols  # the masks: each query's embedding . every pixel


def dpt_counts(config: ViTConfig) -> tuple[int, int]:
    """Depth Anything's DPT neck and head (models/depth_anything.py, layers/dpt.py): the blocks up to the deepest of
    the head's layers (it stops there), no classifier; reassembled maps at 4x, 2x, 1x and 1/2x the grid (the 1/2x
    one a 3x3 stride-2 convolution: ceil(grid / 2)), fused into fusion_dim channels coarse to fine, the finest path
    at 8x the grid, the head's last convolutions at the input's pixels (grid x patch)."""
    dpt = head_settings(config, DPTConfig)
    dim, fusion, head = config.embed_dim, dpt.fusion_dim, dpt.head_dim
    flops = (max(dpt.layers) + 1) * block_flops(config, config.num_tokens)
    rows, cols = config.grid_size
    sizes = [(4 * rows, 4 * cols), (2 * rows, 2 * cols), (rows, cols), (math.ceil(rows / 2), math.ceil(cols / 2))]
    pixels = [height * width for height, width in sizes]
    parts = []
    for channels, size in zip(dpt.neck_sizes, pixels):
        parts.append(conv_counts(dim, channels, 1, rows * cols))  # projects.i
        parts.append(conv_counts(channels, fusion, 3, size, bias=False))  # scratch.layer{i}_rn
    first, second, _, fourth = dpt.neck_sizes
    parts += [
        conv_counts(first, first, 4, rows * cols),  # resize_layers: transposed, counted on the input's pixels
        conv_counts(second, second, 2, rows * cols),
        conv_counts(fourth, fourth, 3, pixels[3]),
    ]
    # refinenet4..1: resConfUnit1 (two 3x3 convs) on the new map, unused on the deepest one but built;
    # resConfUnit2 on the path; out_conv (1x1) after the upsampling to the next map's size, x2 for the finest.
    out_pixels = [64 * rows * cols, *pixels[:3]]  # refinenet1's output is 8x the grid, the others the next map's
    for index, (size, out_size) in enumerate(zip(pixels, out_pixels)):
        unit = conv_counts(fusion, fusion, 3, size)
        parts += [unit, unit, unit, unit] if index < 3 else [unit, unit, (unit[0], 0), (unit[0], 0)]
        parts.append(conv_counts(fusion, fusion, 1, out_size))
    image_pixels = rows * config.patch_size[0] * cols * config.patch_size[1]
    parts += [
        conv_counts(fusion, fusion // 2, 3, out_pixels[0]),  # output_conv1, then resized to the image's pixels
        conv_counts(fusion // 2, head, 3, image_pixels),  # output_conv2
        conv_counts(head, 1, 1, image_pixels),
    ]
    return sum(part[0] for part in parts), flops + sum(part[1] for part in parts)


def linear_segmenter_counts(config: ViTConfig) -> tuple[int, int]:
    """Head kind "linear" (models/segmentation_heads.py): every block, a 1x1 convolution to num_classes on the
    patch grid (the resize to the pixels is not counted)."""
    flops = config.depth * block_flops(config, config.num_tokens)
    params, head_flops = conv_counts(config.embed_dim, config.num_classes, 1, config.num_patches)
    return params, flops + head_flops


def upsampling_segmenter_counts(config: ViTConfig) -> tuple[int, int]:
    """Head kind "upsampling" (SETR-PUP, models/segmentation_heads.py): every block, then ceil(log2(patch)) stages
    (at least one) of a 3x3 convolution to the head's `channels`, GroupNorm and a x2 resize, a 1x1 convolution to
    num_classes."""
    flops = config.depth * block_flops(config, config.num_tokens)
    width = head_settings(config, UpsamplingSegmentationConfig).channels
    params, pixels, in_chans = 0, config.num_patches, config.embed_dim
    for _ in range(max(1, math.ceil(math.log2(max(config.patch_size))))):
        conv = conv_counts(in_chans, width, 3, pixels)
        params, flops = params + conv[0] + 2 * width, flops + conv[1]  # and GroupNorm's scale and bias
        pixels, in_chans = 4 * pixels, width
    conv = conv_counts(width, config.num_classes, 1, pixels)
    return params + conv[0], flops + conv[1]


HEAD_COUNTS: dict[str, Callable[[ViTConfig], tuple[int, int]]] = {
    "none": classifier_counts,
    "eomt": eomt_counts,
    "dpt": dpt_counts,
    "linear": linear_segmenter_counts,
    "upsampling": upsampling_segmenter_counts,
}

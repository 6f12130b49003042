"""The model families' preset variants ("dinov3-B/16", "eomt-L/16", ...): the ViTConfig fields of each family's
architectures at random weights, for `vitlab.variants.variant_config`, `vitlab models`, `bench` and training from
scratch; trained weights load by name (`vitlab pretrained`). `variant_config` builds every preset at 224x224 (an
`image_size` here is overridden; pass image_size= for another).

Torch-free and below checkpoint/: `variants.py` and `models/registry.py` read this table without importing the
family modules, which read and write the families' checkpoints (checkpoint/families/). A family with presets is
its module there and its rows here; a family from outside (a plugin, a test's toy family) adds its rows with
`register`. The paper's sizes, hybrids and small-image presets are config.py's tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitlab.config import MODEL_SIZES
from vitlab.errors import ConfigError
from vitlab.head_configs import DPTConfig, EoMTConfig
from vitlab.preprocessing import IMAGENET_MEAN, IMAGENET_STD, OPENAI_MEAN, OPENAI_STD, Preprocessing

# Depth Anything V2 as released: DINOv2 at patch 14 (LayerScale, eps 1e-6, positions resampled bicubic), no
# classifier, its DPTImageProcessor's defaults (checkpoint/families/depth_anything.py, `DEFAULT_PREPROCESSING`);
# the neck's blocks and widths per size from the original repository's `model_configs` and
# `intermediate_layer_idx` (depth_anything_v2/dpt.py), which transformers' -hf configs repeat. The released models'
# position table is for 518x518 (pass image_size=518).
DEPTH_ANYTHING: dict[str, Any] = dict(
    family="depth_anything",
    patch_size=14,
    num_classes=0,
    layer_scale=1.0,
    pos_resample="bicubic",
    preprocessing=Preprocessing(mode="crop", resize="bicubic"),
    image_mean=IMAGENET_MEAN,
    image_std=IMAGENET_STD,
)
DEPTH_ANYTHING_NECKS: dict[str, DPTConfig] = {
    "S": DPTConfig(layers=(2, 5, 8, 11), neck_sizes=(48, 96, 192, 384), fusion_dim=64, head_dim=32),
    "B": DPTConfig(layers=(2, 5, 8, 11), neck_sizes=(96, 192, 384, 768), fusion_dim=128, head_dim=32),
    "L": DPTConfig(layers=(4, 11, 17, 23), neck_sizes=(256, 512, 1024, 1024), fusion_dim=256, head_dim=32),
}

# C-RADIO's arithmetic (transformers' RadioConfig defaults, written for nvidia/C-RADIOv4-H): 3 summary tokens of
# which the summary reads the first two, 7 registers, a table for up to 2048 pixels, CLIP's statistics.
RADIO: dict[str, Any] = dict(
    family="radio",
    num_classes=0,
    classifier="token",
    summary_tokens=(0, 1),
    register_tokens=3 + 7 - 1,
    prefix_positions=False,
    pos_embed="cpe",
    cpe_max_size=2048,
    final_norm=False,
    image_mean=OPENAI_MEAN,
    image_std=OPENAI_STD,
)

# EoMT's released models (tue-mps, transformers' conversions): DINOv2 with 4 registers, LayerScale, 16x16 patches,
# the queries in the last 4 blocks, two x2 upscaling blocks (the masks at 1/4 of the input).
EOMT: dict[str, Any] = dict(
    patch_size=16,
    register_tokens=4,
    layer_scale=1.0,
    prefix_positions=False,
    family="eomt",
    image_mean=IMAGENET_MEAN,
    image_std=IMAGENET_STD,
)
EOMT_PANOPTIC = EoMTConfig(queries=200, blocks=4, upscale_blocks=2)  # reads a photo fitted and padded
EOMT_SEMANTIC = EoMTConfig(queries=100, blocks=4, upscale_blocks=2, crops=True)  # as overlapping square crops

# DINOv3's architecture at the paper's sizes: rotary positions, 4 registers, LayerScale, no key bias, LayerNorm eps
# 1e-5, the class token as output.
DINOV3: dict[str, Any] = dict(
    family="dinov3",
    pos_embed="rope",
    register_tokens=4,
    layer_scale=1.0,
    key_bias=False,
    layer_norm_eps=1e-5,
    rope_rescale=2.0,
    num_classes=0,
    image_mean=IMAGENET_MEAN,
    image_std=IMAGENET_STD,
)

# AIMv2's architecture: RMSNorm (also on the patches), SwiGLU, no biases, the attention-probe head, 128-wide heads.
AIMV2: dict[str, Any] = dict(
    family="aimv2",
    classifier="probe",
    class_token=False,
    norm="rmsnorm",
    mlp="swiglu",
    patch_norm=True,
    qkv_bias=False,
    proj_bias=False,
    mlp_bias=False,
    layer_norm_eps=1e-5,
    num_classes=0,
    image_mean=OPENAI_MEAN,
    image_std=OPENAI_STD,
)

# SigLIP 2's architecture: SigLIP's tower (no class token, MAP head, tanh GELU), antialiased table resizing.
SIGLIP2: dict[str, Any] = dict(
    family="siglip2",
    classifier="map",
    class_token=False,
    mlp_activation="gelu_tanh",
    pos_resample="bilinear_antialias",
    num_classes=0,
)

# Variant name -> ViTConfig fields, by the families' age: the encoders, then the image towers (CLIP, SigLIP).
FAMILY_PRESETS: dict[str, Mapping[str, Any]] = {
    **{
        f"depth-anything-v2-{size}/14": dict(MODEL_SIZES[size], **DEPTH_ANYTHING, head=DEPTH_ANYTHING_NECKS[size])
        for size in "SBL"
    },
    "c-radio-H/16": dict(RADIO, embed_dim=1280, depth=32, num_heads=16, mlp_dim=5120, patch_size=16, image_size=224),
    # COCO panoptic (133 classes, 200 queries, 640x640) and ADE20K semantic (150 classes, 100 queries, 512).
    "eomt-L/16": dict(MODEL_SIZES["L"], **EOMT, image_size=640, num_classes=133, head=EOMT_PANOPTIC),
    # A semantic model reads a photo as overlapping square crops (its processor's do_split_image).
    "eomt-L/16-ade20k": dict(MODEL_SIZES["L"], **EOMT, image_size=512, num_classes=150, head=EOMT_SEMANTIC),
    "eomt-B/16": dict(MODEL_SIZES["B"], **EOMT, image_size=640, num_classes=133, head=EOMT_PANOPTIC),
    **{f"dinov3-{size}/16": dict(MODEL_SIZES[size], **DINOV3, patch_size=16) for size in "SBL"},
    "aimv2-L/14": dict(embed_dim=1024, depth=24, num_heads=8, mlp_dim=2816, patch_size=14, **AIMV2),
    "siglip2-B/16": dict(MODEL_SIZES["B"], patch_size=16, **SIGLIP2),
}


def register(presets: Mapping[str, Mapping[str, Any]]) -> None:
    """Add a family's preset variants from outside this module (a plugin, a test's toy family); a ConfigError for
    a name the table has already."""
    taken = sorted(set(presets) & set(FAMILY_PRESETS))
    if taken:
        raise ConfigError(f"the preset variants {', '.join(taken)} exist already; give the new ones other names")
    FAMILY_PRESETS.update(presets)

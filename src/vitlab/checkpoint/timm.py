"""timm checkpoints: vitlab's parameter names are timm's, so a timm `VisionTransformer` state dict loads as it is,
but for the MLP of DINOv2's giant (`SwiGLUPacked`: gate and value in one `fc1`), split into vitlab's SwiGLU.

What a state dict cannot say (the head count, the pooling of an avg model with a class token) comes from a
sidecar: a JSON of timm constructor arguments beside the weights (`<name>.json`), a timm hub `config.json`
whose `architecture` names a known model, or, failing both, the paper's head count for the width.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.io import (
    Weights,
    exported_config,
    image_size_from_positions,
    require_plain_blocks,
)
from vitlab.config import HEADS_BY_WIDTH, MODEL_SIZES, ViTConfig, stem_stride
from vitlab.errors import CheckpointError
from vitlab.preprocessing import Preprocessing

if TYPE_CHECKING:  # no tensor is made here; the family table imports this module (io.py says why)
    import torch

# timm's size names and the paper's, so "vit_base_patch16_224" finds B's head count.
TIMM_SIZE_NAMES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H"}


def is_timm_state_dict(keys: set[str]) -> bool:
    """Whether tensor names are timm's VisionTransformer's (vitlab's own names too)."""
    return "patch_embed.proj.weight" in keys and any(key.startswith("blocks.") for key in keys)


def is_timm_layout(weights: Weights) -> bool:
    """Key signature of timm's VisionTransformer layout: its patch embedding and blocks."""
    return is_timm_state_dict(set(weights.tensors))


def is_packed_swiglu(state: dict[str, torch.Tensor]) -> bool:
    """Whether a timm state dict's MLP is timm's `SwiGLUPacked` (`vit_giant_patch14_dinov2`): one `fc1` holding the
    gate's rows, then the value's, twice as many as `fc2` reads (a plain MLP's fc1 has as many as fc2 reads)."""
    fc1, fc2 = state.get("blocks.0.mlp.fc1.weight"), state.get("blocks.0.mlp.fc2.weight")
    return fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]


def timm_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str = "") -> dict[str, torch.Tensor]:
    """timm's names are vitlab's, but for `SwiGLUPacked`'s one `fc1`, whose halves are vitlab's gate (`fc1_g`) and
    value (`fc1_x`): timm's GluMlp with gate_last=False computes act(first half) * second half."""
    if config.mlp != "swiglu" or not is_packed_swiglu(state):
        return state
    out = dict(state)
    for layer in range(config.depth):
        mlp = f"blocks.{layer}.mlp."
        for kind in ("weight", "bias") if config.mlp_bias else ("weight",):
            gate, value = out.pop(f"{mlp}fc1.{kind}").chunk(2)  # (2H, D) -> two (H, D)
            out[f"{mlp}fc1_g.{kind}"], out[f"{mlp}fc1_x.{kind}"] = gate, value
    return out


def read_config(weights: Weights) -> ViTConfig:
    """The config of a timm state dict: the exact one that vitlab's timm export writes into the header, else
    `config_from_timm` of the names and shapes, completed by the timm JSON beside it and the caller's hints."""
    exported = exported_config(weights)
    if exported is not None:
        return exported
    sidecar_hints = hints_from_timm_json(weights.sidecar) if weights.sidecar else {}
    return config_from_timm(weights.tensors, weights.source, {**sidecar_hints, **weights.hints}, weights.image_size)


def hints_from_timm_json(data: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments (`img_size`, `num_heads`, ...) or a hub config (`architecture`) -> config hints."""
    hints: dict[str, Any] = {}
    args = dict(data.get("model_args", {}), **{k: v for k, v in data.items() if k != "model_args"})
    if "architecture" in args:
        match = re.match(r"vit_(tiny|small|base|large|huge)_", str(args["architecture"]))
        if match:
            hints["num_heads"] = MODEL_SIZES[TIMM_SIZE_NAMES[match.group(1)]]["num_heads"]
        # Sizes whose head count is not the paper's for the width: SigLIP's So400m (1152 wide, 16 heads) and
        # AIMv2's 128-wide heads (L 1024 -> 8, H 1536 -> 12, 1B 2048 -> 16, 3B 3072 -> 24).
        named = re.match(r"(?:vit_(so400m)|aimv2_(large|huge|1b|3b))_", str(args["architecture"]))
        if named:
            hints["num_heads"] = {"so400m": 16, "large": 8, "huge": 12, "1b": 16, "3b": 24}[
                named.group(1) or named.group(2)
            ]
        if re.match(r"vit_giant_patch14_(?:reg\d+_)?(?:dinov2|tipsv2)", str(args["architecture"])):
            # DINOv2's giant and TIPSv2's: 1536 wide, 24 heads of 64 (timm's other giants are 1408 wide)
            hints["num_heads"] = 24
        if re.match(r"vit_\w+_reg1_tipsv2", str(args["architecture"])):
            hints["family"] = "tipsv2"  # timm's vit_*_patch14_reg1_tipsv2: TIPSv2's image tower under timm's names
    for timm_name, our_name in (
        ("num_heads", "num_heads"),
        ("img_size", "image_size"),
        ("qkv_bias", "qkv_bias"),
        ("class_token", "class_token"),
        ("fc_norm", "fc_norm"),
        ("reg_tokens", "register_tokens"),
        ("init_values", "layer_scale"),
    ):
        if args.get(timm_name) is not None:
            hints[our_name] = args[timm_name]
    if args.get("no_embed_class") is not None:
        hints["prefix_positions"] = not args["no_embed_class"]
    if "quickgelu" in str(args.get("architecture", "")):
        hints["mlp_activation"] = "quick_gelu"  # timm names OpenAI's CLIP towers *_clip_quickgelu_*
    if args.get("pre_norm") is not None:
        hints["pre_norm"] = bool(args["pre_norm"])
    if "global_pool" in args:
        hints["classifier"] = {"token": "token", "avg": "gap", "map": "map"}.get(args["global_pool"], "")
        if not hints["classifier"]:
            raise CheckpointError(
                f"timm global_pool={args['global_pool']!r} is not supported; vitlab has 'token', 'avg' and 'map'"
            )
    if args.get("act_layer") is not None:
        if args["act_layer"] not in ("gelu", "gelu_tanh", "quick_gelu"):
            raise CheckpointError(
                f"timm act_layer={args['act_layer']!r} is not supported; vitlab has 'gelu', "
                "'gelu_tanh' and 'quick_gelu'"
            )
        hints["mlp_activation"] = args["act_layer"]
    if args.get("label_names"):
        hints["class_names"] = list(args["label_names"])
    if str(args.get("architecture", "")).startswith("deit"):
        hints["family"] = "deit"
    pretrained = args.get("pretrained_cfg") or {}
    if pretrained.get("mean") and pretrained.get("std"):
        hints["image_mean"], hints["image_std"] = tuple(pretrained["mean"]), tuple(pretrained["std"])
    if pretrained.get("interpolation") in ("bilinear", "bicubic") or pretrained.get("crop_pct") is not None:
        hints["preprocessing"] = Preprocessing(
            mode="stretch" if pretrained.get("crop_mode") == "squash" else "crop",
            resize=pretrained.get("interpolation")
            if pretrained.get("interpolation") in ("bilinear", "bicubic")
            else "bicubic",
            crop_fraction=1.0 if pretrained.get("crop_mode") == "squash" else pretrained.get("crop_pct") or 1.0,
        )
    return hints


# timm's pretrained configs (pretrained_cfg: mean, std, interpolation, crop_pct) per family, for a file that comes
# without one: DeiT trains and evaluates on ImageNet statistics with a 0.875 crop; CLIP towers on OpenAI's
# statistics, the shorter side to the input size and the centre (crop_pct 1.0); the AugReg ViTs (timm's default
# vit_* weights) on [-1, 1] with a 0.9 crop. All bicubic.
TIMM_FAMILY_PREPROCESSING: dict[str, dict[str, Any]] = {
    "deit": dict(
        image_mean=(0.485, 0.456, 0.406),
        image_std=(0.229, 0.224, 0.225),
        preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=0.875),
    ),
    "clip": dict(
        image_mean=(0.48145466, 0.4578275, 0.40821073),
        image_std=(0.26862954, 0.26130258, 0.27577711),
        preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0),
    ),
    "augreg": dict(
        image_mean=(0.5,),
        image_std=(0.5,),
        preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=0.9),
    ),
    # TIPSv2 (timm's vit_*_reg1_tipsv2.webli cfgs): [0, 1] pixels, no mean or std, the centre at crop_pct 1.0.
    "tipsv2": dict(
        image_mean=(0.0,),
        image_std=(1.0,),
        preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0),
    ),
}
# The families whose timm files are theirs in vitlab's config too (`ViTConfig.family`, so `export --to hf` writes
# their transformers layout), with the arithmetic a state dict cannot say: TIPSv2 resizes its position table
# bilinearly with antialiasing, as the reference model does (timm's own dynamic resize is bicubic).
TIMM_FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "tipsv2": dict(family="tipsv2", pos_resample="bilinear_antialias"),
}


def config_from_timm(
    state: dict[str, torch.Tensor],
    source: str,
    hints: dict[str, Any] | None = None,
    given_image_size: int | tuple[int, int] | None = None,
) -> ViTConfig:
    """Infer a ViTConfig from a timm / vitlab state dict's names and shapes, completed by `hints`.

    Pooling follows timm's own rule: `fc_norm` exists exactly when the pool is an average (timm's `fc_norm=None`
    default), and the average is over the patch tokens only, the class token left out. So `fc_norm.*` means an
    average pool whether or not there is a class token (the MAE fine-tuned layout), a class token without it means
    the class token feeds the head, and no class token means an average. A model built against that default
    (timm's `global_pool="token", fc_norm=True`, or `global_pool="avg", fc_norm=False`) says so in its sidecar
    JSON (`global_pool`), which decides.
    given_image_size: the size the user gave; the checkpoint's own when its position table is not square."""
    hints = dict(hints or {})
    proj = state["patch_embed.proj.weight"]  # (D, C, P_h, P_w)
    embed_dim = proj.shape[0]
    depth = len({m.group(1) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))})
    gated = "blocks.0.mlp.fc1_g.weight" in state  # SwiGLU (AIMv2)
    packed = is_packed_swiglu(state)  # SwiGLU with gate and value in one fc1 (DINOv2's giant)
    if packed:
        mlp_dim = state["blocks.0.mlp.fc2.weight"].shape[1]
    else:
        mlp_dim = state["blocks.0.mlp.fc1_g.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0]
    rms = "blocks.0.norm1.weight" in state and "blocks.0.norm1.bias" not in state  # timm's RmsNorm has no bias
    class_token = "cls_token" in state
    distilled = "dist_token" in state  # timm's VisionTransformerDistilled (DeiT): dist_token and head_dist
    register_tokens = state["reg_token"].shape[1] if "reg_token" in state else 0  # DINOv2 with registers
    resnet_layers, width_factor, in_chans = None, 1.0, proj.shape[1]
    stem = "patch_embed.backbone.stem.conv.weight"
    if stem in state:
        in_chans = state[stem].shape[1]
        width_factor = state[stem].shape[0] / 64
        stages = sorted(
            {int(m.group(1)) for k in state if (m := re.match(r"patch_embed\.backbone\.stages\.(\d+)\.", k))}
        )
        resnet_layers = tuple(
            len(
                {
                    m.group(1)
                    for k in state
                    if (m := re.match(rf"patch_embed\.backbone\.stages\.{s}\.blocks\.(\d+)\.", k))
                }
            )
            for s in stages
        )
    num_heads = hints.pop("num_heads", None) or HEADS_BY_WIDTH.get(embed_dim)
    if num_heads is None:
        raise CheckpointError(
            f"{source}: the head count of a width-{embed_dim} model cannot be read from its weights; put a JSON of "
            'its timm arguments beside it (e.g. {"num_heads": 4}) or pass --num-heads'
        )
    stride = stem_stride(resnet_layers)
    prefix = int(class_token) + int(distilled) + register_tokens
    prefix_positions = hints.pop("prefix_positions", None)
    if prefix_positions is None:
        prefix_positions = prefix_rows_in_table(
            state["pos_embed"].shape[1],
            prefix,
            tuple(proj.shape[2:]),
            stride,
            hints.get("image_size") or given_image_size,
            source,
            register_tokens,
        )
    image_size = hints.pop("image_size", None)
    if image_size is None:
        rows = state["pos_embed"].shape[1] - (prefix if prefix_positions else 0)
        image_size = image_size_from_positions(rows, tuple(proj.shape[2:]), stride, source, given_image_size)
    fields: dict[str, Any] = dict(
        image_size=image_size,
        patch_size=tuple(proj.shape[2:]),
        in_chans=in_chans,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        class_token=class_token,
        classifier="map"
        if "attn_pool.latent" in state
        else "token"
        if class_token and "fc_norm.weight" not in state
        else "gap",
        fc_norm="fc_norm.weight" in state,
        representation_size=state["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in state else None,
        resnet_layers=resnet_layers,
        resnet_width_factor=width_factor,
        distilled=distilled,
        register_tokens=register_tokens,
        prefix_positions=prefix_positions,
        # timm's pre_norm models are CLIP towers, whose LayerNorms use eps 1e-5 (a state dict cannot say).
        pre_norm="norm_pre.weight" in state,
        # CLIP towers and AIMv2 (RMSNorm) use eps 1e-5; the others timm's 1e-6 (a state dict cannot say).
        layer_norm_eps=1e-5 if "norm_pre.weight" in state or rms else 1e-6,
        norm="rmsnorm" if rms else "layernorm",
        mlp="swiglu" if gated or packed else "mlp",
        qk_norm="blocks.0.attn.q_norm.weight" in state,
        proj_bias="blocks.0.attn.proj.weight" not in state or "blocks.0.attn.proj.bias" in state,
        mlp_bias="blocks.0.mlp.fc2.bias" in state,
        patch_norm="patch_embed.norm.weight" in state,
        # timm's CLIP conversion writes the image-text projection as the head with an all-zero bias, which no
        # trained classifier has: with norm_pre, that head is CLIP's projection.
        projection="norm_pre.weight" in state and "head.bias" in state and not state["head.bias"].any(),
        layer_scale=hints.pop("layer_scale", None) or (1e-5 if "blocks.0.ls1.gamma" in state else None),
        distillation_head=distilled and ("head_dist.weight" in state or "head.weight" not in state),
    )
    # AIMv2 (RMSNorm on the patches too) is evaluated on OpenAI's CLIP statistics, as CLIP towers are.
    clip_like = fields["pre_norm"] or (rms and fields["patch_norm"])
    family = hints.pop("family", None) or ("deit" if distilled else "clip" if clip_like else "augreg")
    fields.update(TIMM_FAMILY_PREPROCESSING[family])
    fields.update(TIMM_FAMILY_FIELDS.get(family, {}))
    fields.update(hints)
    if fields["pre_norm"] and "mlp_activation" not in hints:
        warnings.warn(
            f"{source}: a CLIP-style tower (norm_pre) without its timm arguments: the weights cannot tell "
            "GELU (open_clip / LAION training) from QuickGELU (OpenAI's); assumed GELU, timm's default. For "
            'OpenAI weights put {"act_layer": "quick_gelu"} in a JSON beside the file',
            stacklevel=2,
        )
    return ViTConfig(**fields)


def prefix_rows_in_table(
    rows: int,
    prefix: int,
    patch_size: tuple[int, int],
    stride: int,
    image_size: int | tuple[int, int] | list[int] | None,
    source: str,
    register_tokens: int = 0,
) -> bool:
    """Whether a timm position table has rows for the prefix tokens (timm's default) or for the patches only
    (`no_embed_class=True`). With the image size it was made for the row count says; otherwise a model without register
    tokens follows timm's default, and one with registers (timm builds those with no_embed_class) is read by
    which count makes a square grid of patches."""
    if prefix == 0:
        return True
    if image_size is not None:
        height, width = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        patches = (height // (patch_size[0] * stride)) * (width // (patch_size[1] * stride))
        if rows in (prefix + patches, patches):
            return rows == prefix + patches
        # Neither: the size is a target to resample to (or wrong, which the size check then reports).
    if not register_tokens:
        return True
    with_prefix, patches_only = math.isqrt(rows - prefix) ** 2 == rows - prefix, math.isqrt(rows) ** 2 == rows
    if with_prefix != patches_only:
        return with_prefix
    raise CheckpointError(
        f"{source}: a {rows}-row position table with {prefix} prefix tokens could be read either "
        "way (with or without rows for the prefix tokens); say which with no_embed_class in the "
        "sidecar JSON of timm arguments, or give --image-size"
    )


def shape_args(config: ViTConfig) -> dict[str, Any]:
    """The constructor arguments every timm ViT class (VisionTransformer, Eva) takes for a config's shape."""
    return dict(
        img_size=list(config.image_size),
        patch_size=list(config.patch_size),
        in_chans=config.in_chans,
        num_classes=config.num_classes,
        embed_dim=config.embed_dim,
        depth=config.depth,
        num_heads=config.num_heads,
        mlp_ratio=config.mlp_dim / config.embed_dim,
        qkv_bias=config.qkv_bias,
    )


def timm_model_args(config: ViTConfig) -> dict[str, Any]:
    """timm `VisionTransformer(**args)` arguments that rebuild `config` (plain ViT only)."""
    require_plain_blocks(config, "timm's VisionTransformer, as vitlab writes its arguments,")
    if config.resnet_layers is not None:
        raise CheckpointError(
            "vitlab does not export hybrids to timm (timm builds them from a separate ResNetV2 "
            "backbone, which its constructor arguments cannot describe), so nothing was written; "
            "keep vitlab's format: vitlab convert CHECKPOINT OUT.safetensors"
        )
    if (
        config.pos_embed not in ("learned", "sincos2d")
        or config.pos_embed_placement != "input"
        or config.classifier not in ("token", "gap", "map")
    ):
        raise CheckpointError(
            f"timm's VisionTransformer has no {config.pos_embed} position embedding placed at "
            f"{config.pos_embed_placement!r} with {config.classifier!r} pooling (it has a 1-D table at the input and "
            "token, avg or map pooling), so nothing was written; keep vitlab's format: vitlab convert CHECKPOINT "
            "OUT.safetensors"
        )
    if config.layer_norm_eps != (1e-5 if config.pre_norm else 1e-6) or config.pos_embed != "learned":
        warnings.warn(
            "timm's constructor arguments cannot express layer_norm_eps != 1e-6 or a fixed sin-cos "
            "position embedding; the weights file carries vitlab's exact config, but a model built in "
            "timm from these arguments will differ slightly",
            stacklevel=2,
        )
    args: dict[str, Any] = dict(
        shape_args(config),
        class_token=config.class_token,
        global_pool={"token": "token", "gap": "avg", "map": "map"}[config.classifier],
        fc_norm=config.fc_norm,
    )
    if config.mlp_activation in ("gelu_tanh", "quick_gelu"):
        args["act_layer"] = config.mlp_activation  # timm's default is the exact GELU
    if config.pre_norm:
        args["pre_norm"] = True
    if config.representation_size:
        args["representation_size"] = config.representation_size  # older timm releases only
    if config.register_tokens:
        args["reg_tokens"] = config.register_tokens
    if not config.prefix_positions:
        args["no_embed_class"] = True
    if config.layer_scale is not None:
        args["init_values"] = config.layer_scale
    if config.distilled:
        warnings.warn(
            "timm builds distilled (DeiT) models with timm.models.deit.VisionTransformerDistilled, "
            "whose arguments these are; VisionTransformer itself has no distillation token",
            stacklevel=2,
        )
    return args

"""timm's DINOv3 (`timm.models.eva.Eva`, `vit_*_patch16_dinov3*`), both ways.

timm writes DINOv3 in its EVA layout, which is vitlab's (timm's VisionTransformer) names but for three parts:
LayerScale is the bare `blocks.N.gamma_1` / `gamma_2` (vitlab's `ls1.gamma` / `ls2.gamma`); the `_qkvb` models
keep the fused `attn.qkv.weight` with separate `attn.q_bias` and `attn.v_bias` (the key bias is a zero buffer
timm does not save: vitlab's `key_bias` False, a zero slice of `attn.qkv.bias`), and the plain ones have no qkv
bias at all; there is no position table, the rotary positions being computed from each image's grid exactly as
HF's DINOv3 and vitlab's pos_embed "rope" do (theta 100, coordinates normalised per axis to [-1, 1], the class
and 4 register tokens left unturned). Heads are 64 wide (128 in the 7B); the MLP is GELU or, in S+, H+ and 7B,
SwiGLU (`mlp.fc1_g`, `fc1_x`, `fc2`: vitlab's names). Norms are LayerNorms with eps 1e-5.

timm's pretrained configs pool by the patch-token mean (`global_pool="avg"`); DINOv3's own output is the class
token, which is what vitlab reads these files as (classifier "token", as transformers' DINOv3ViTModel pools).
Weights read, files say nothing of the pooling; pass `--set classifier=gap` for timm's average.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from vitlab.checkpoint.io import TensorPicker, Weights, apply_hints, exported_config
from vitlab.checkpoint.timm import shape_args
from vitlab.config import ViTConfig
from vitlab.data.contract import Preprocessing
from vitlab.errors import CheckpointError

if TYPE_CHECKING:  # torch is imported where tensors are made: the family table imports this module
    import torch

IMAGENET = dict(image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
# timm's pretrained_cfg of the DINOv3 weights: input 256, ImageNet statistics, bicubic, crop_pct 1.0.
PREPROCESSING: dict[str, Any] = dict(
    **IMAGENET, preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0)
)


def is_timm_dinov3(weights: Weights) -> bool:
    """Key signature: timm's block names with EVA's bare LayerScale and no position table."""
    keys = set(weights.tensors)
    return (
        "patch_embed.proj.weight" in keys
        and "blocks.0.gamma_1" in keys
        and "pos_embed" not in keys
        and "reg_token" in keys
    )


def read_config(weights: Weights) -> ViTConfig:
    """DINOv3's config from the shapes (or the exact one vitlab's own timm export put in the header)."""
    exported = exported_config(weights)
    if exported is not None:
        return exported
    state, source = weights.tensors, weights.source
    proj = state["patch_embed.proj.weight"]
    dim = proj.shape[0]
    hints = dict(weights.hints)
    args = dict((weights.sidecar or {}).get("model_args", {}), **(weights.sidecar or {}))
    num_heads = hints.pop("num_heads", None) or args.get("num_heads") or (32 if dim == 4096 else dim // 64)
    if dim % num_heads:
        raise CheckpointError(f"{source}: width {dim} does not divide into {num_heads} heads; pass --num-heads")
    gated = "blocks.0.mlp.fc1_g.weight" in state
    config = ViTConfig(
        family="dinov3",
        image_size=args.get("img_size", 256),
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=dim,
        depth=len({m.group(1) for key in state if (m := re.match(r"blocks\.(\d+)\.", key))}),
        num_heads=num_heads,
        mlp_dim=state["blocks.0.mlp.fc1_g.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0],
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        classifier="token",
        register_tokens=state["reg_token"].shape[1],
        layer_scale=1e-5,
        pos_embed="rope",
        rope_theta=float(args.get("rope_temperature", 100.0)),
        mlp="swiglu" if gated else "mlp",
        qkv_bias="blocks.0.attn.q_bias" in state,
        key_bias=False,
        layer_norm_eps=1e-5,
        **PREPROCESSING,
    )
    return apply_hints(config, hints)


def eva_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """timm EVA names -> vitlab's: gamma_N -> lsN.gamma, q_bias and v_bias around a zero key bias."""
    import torch

    picker = TensorPicker(state, source, "timm DINOv3")
    out = {}
    for key in list(state):
        if key.endswith((".q_bias", ".v_bias")):
            continue
        name = re.sub(r"\.gamma_([12])$", r".ls\1.gamma", key)
        out[name] = picker.take(key)
    if config.qkv_bias and not config.key_bias:
        for layer in range(config.depth):
            attn = f"blocks.{layer}.attn."
            query, value = picker.take(attn + "q_bias"), picker.take(attn + "v_bias")
            out[attn + "qkv.bias"] = torch.cat([query, torch.zeros_like(query), value])
    picker.check_all_taken()
    return out


def state_dict_to_eva(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> timm EVA's (the inverse of `eva_to_state_dict`) for a model in DINOv3's arithmetic."""
    if config.family != "dinov3" or config.layer_scale is None or config.key_bias:
        raise CheckpointError(
            "timm's DINOv3 (EVA) layout holds DINOv3 models: rotary positions, LayerScale, no key bias; "
            "export this model as vitlab's own file"
        )
    out = {}
    dim = config.embed_dim
    for key, value in state.items():
        if key.endswith("attn.qkv.bias"):
            attn = key.removesuffix("qkv.bias")
            out[attn + "q_bias"], out[attn + "v_bias"] = value[:dim], value[2 * dim :]
            continue
        out[re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", key)] = value
    return out


def eva_model_args(config: ViTConfig) -> dict[str, Any]:
    """timm `Eva(**args)` arguments that rebuild a DINOv3 `config` (timm's `vit_*_patch16_dinov3*` model_args),
    pooling by the class token as DINOv3 does (timm's pretrained configs average)."""
    return dict(
        shape_args(config),
        swiglu_mlp=config.mlp == "swiglu",
        init_values=config.layer_scale,
        num_reg_tokens=config.register_tokens,
        use_abs_pos_emb=False,
        use_rot_pos_emb=True,
        rope_type="dinov3",
        rope_temperature=config.rope_theta,
        rope_rotate_half=True,
        use_fc_norm=False,
        global_pool="token",
        dynamic_img_size=True,
        norm_layer_eps=config.layer_norm_eps,  # timm builds partial(LayerNorm, eps=1e-5); stated for the reader
    )


# ------------------------------------------------------------------------------------------ Perception Encoder
# timm's pretrained configs of Perception Encoder: [-1, 1] inputs, bicubic, crop_pct 1.0.
PE_PREPROCESSING: dict[str, Any] = dict(
    image_mean=(0.5,), image_std=(0.5,), preprocessing=Preprocessing(mode="crop", resize="bicubic", crop_fraction=1.0)
)


def is_timm_pe(weights: Weights) -> bool:
    """Key signature of timm's Perception Encoder (`vit_pe_*`: EVA with rotary positions, which leave no tensor).
    Its names are those of timm's CLIP towers (pre-encoder norm, bias-free patch projection, a learned table), so
    a JSON of timm arguments naming a `vit_pe_` architecture decides; without one, what no CLIP tower has: an
    attention-pooling head (PE core) or no final norm (PE lang and spatial)."""
    keys = set(weights.tensors)
    architecture = str((weights.sidecar or {}).get("architecture", ""))
    clip_like = (
        "patch_embed.proj.weight" in keys
        and "patch_embed.proj.bias" not in keys
        and "norm_pre.weight" in keys
        and "pos_embed" in keys
        and "reg_token" not in keys
    )
    if not clip_like:
        return False
    if architecture:
        return "_pe_" in architecture or architecture.startswith("pe_")
    return "attn_pool.latent" in keys or "norm.weight" not in keys


def read_pe_config(weights: Weights) -> ViTConfig:
    """Perception Encoder's config from the shapes and, where it has one, the JSON of timm arguments beside it."""
    exported = exported_config(weights)
    if exported is not None:
        return exported
    state, source = weights.tensors, weights.source
    args = dict((weights.sidecar or {}).get("model_args", {}), **(weights.sidecar or {}))
    hints = dict(weights.hints)
    proj = state["patch_embed.proj.weight"]
    dim, class_token = proj.shape[0], "cls_token" in state
    # 64-wide heads, but the gigantic models' 16 heads of 96.
    num_heads = hints.pop("num_heads", None) or args.get("num_heads") or (16 if dim == 1536 else dim // 64)
    rows = state["pos_embed"].shape[1] - int(class_token)
    side = math.isqrt(rows)
    if side * side != rows:
        raise CheckpointError(f"{source}: a {rows}-row position table is not a square grid; give its timm arguments")
    pooled = "attn_pool.latent" in state
    config = ViTConfig(
        family="pe",
        image_size=args.get("img_size", side * proj.shape[2]),
        patch_size=tuple(proj.shape[2:]),
        in_chans=proj.shape[1],
        embed_dim=dim,
        depth=len({m.group(1) for key in state if (m := re.match(r"blocks\.(\d+)\.", key))}),
        num_heads=num_heads,
        mlp_dim=state["blocks.0.mlp.fc1.weight"].shape[0],
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        projection="head.weight" in state,
        classifier="map" if pooled else "gap",
        class_token=class_token,
        pre_norm=True,
        final_norm="norm.weight" in state,
        layer_scale=0.1 if "blocks.0.gamma_1" in state else None,
        pos_embed="pe_rope",
        rope_theta=float(args.get("rope_temperature", 10000.0)),
        pool_heads=args.get("attn_pool_num_heads", 8) if pooled else None,
        pool_mlp_dim=state["attn_pool.mlp.fc1.weight"].shape[0] if pooled else None,
        layer_norm_eps=1e-5,
        **PE_PREPROCESSING,
    )
    return apply_hints(config, hints)


def pe_to_state_dict(state: dict[str, torch.Tensor], config: ViTConfig, source: str) -> dict[str, torch.Tensor]:
    """timm PE names -> vitlab's: only LayerScale's bare gamma_N differ; the head's projection gets its zero bias
    where a file left it out."""
    import torch

    picker = TensorPicker(state, source, "timm Perception Encoder")
    out = {re.sub(r"\.gamma_([12])$", r".ls\1.gamma", key): picker.take(key) for key in list(state)}
    if config.num_classes and "head.bias" not in out:
        out["head.bias"] = torch.zeros(config.num_classes)
    picker.check_all_taken()
    return out


def state_dict_to_pe(state: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """vitlab names -> timm PE's (the inverse of `pe_to_state_dict`)."""
    if config.family != "pe":
        raise CheckpointError(
            "timm's Perception Encoder layout holds PE models; export this model as vitlab's own file"
        )
    return {re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", key): value for key, value in state.items()}
